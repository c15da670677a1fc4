"""Where Gemini really put the chunks, which is not always where the placement policy asked.

A model (more exactly, a data-parallel parameter group) with fewer parameters than
``min_chunk_size`` becomes one chunk that Gemini keeps gathered on the GPU, as it does every chunk
when ``enable_distributed_storage=False`` fixes a ``chunk_size``; such chunks are never offloaded.
"""

from __future__ import annotations

from typing import Any


def kept_gathered_parameters(gemini_optimizer: Any) -> int:
    """How many parameters (elements) sit in chunks Gemini keeps gathered on the GPU."""
    return sum(chunk.utilized_size for chunk in gemini_optimizer.chunk16_set if chunk.keep_gathered)


def chunks_with_gpu_master_weights(gemini_optimizer: Any) -> int:
    """How many chunks have their fp32 master weights (what the optimizer updates) on the GPU."""
    masters = (
        chunk.paired_chunk if chunk.paired_chunk is not None else chunk for chunk in gemini_optimizer.chunk16_set
    )
    return sum(1 for master in masters if master.device_type != "cpu")
