"""Gemini's static placement, offloading the share of chunks it is asked to.

ColossalAI 0.5.0's StaticPlacementPolicy sizes the offloaded share against the memory of every chunk counted once
per parameter it holds (``setup_grads_device`` sums ``get_chunk(p).chunk_mem`` over parameters), then walks the
chunks once each. Its target is therefore many times the real total, and every ``offload_optim_frac`` we tried
offloaded every chunk's optimizer side: measured on an H200, a 2.7B GPT asked to offload 45% held 14 bytes per
parameter on the host, as full offload does, and a 13B one was killed for host memory. The policy here counts
each chunk once and walks them in the model's order, so every rank picks the same chunks. (``offload_param_frac``
is sized the same way; the strategy takes only 0 or 1 for it, since Gemini moves parameter chunks all or none.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator
from typing import Any

_SWAPPING = threading.Lock()


def chunks_to_offload(chunks: list[Any], fraction: float) -> set[Any]:
    """The leading chunks, in order, whose memory first reaches ``fraction`` of all (gathered ones stay)."""
    target = fraction * sum(chunk.chunk_mem for chunk in chunks)
    chosen: set[Any] = set()
    offloaded = 0
    for chunk in chunks:
        if offloaded >= target:
            break
        if not chunk.keep_gathered:
            chosen.add(chunk)
            offloaded += chunk.chunk_mem
    return chosen


def share_by_chunk_policy() -> type:
    """StaticPlacementPolicy with the offloaded shares measured over distinct chunks."""
    import torch
    from colossalai.accelerator import get_accelerator
    from colossalai.zero.gemini.placement_policy import StaticPlacementPolicy

    class ShareByChunkPlacementPolicy(StaticPlacementPolicy):
        def setup_grads_device(self, params: list[Any], grads_device_map: dict[Any, Any]) -> None:
            chunks = list(dict.fromkeys(self.chunk_manager.get_chunk(p) for p in params))
            offloaded = chunks_to_offload(chunks, self.offload_optim_frac)
            gpu, cpu = get_accelerator().get_current_device(), torch.device("cpu")
            for chunk in chunks:
                for p in chunk.get_tensors():
                    grads_device_map[p] = cpu if chunk in offloaded else gpu
            total = sum(chunk.chunk_mem for chunk in chunks)
            self.keep_gathered_chunk_mem = total * (1 - self.shard_param_frac)
            self.keep_cuda_chunk_mem = total * (1 - self.offload_param_frac)

    return ShareByChunkPlacementPolicy


@contextlib.contextmanager
def static_placement_by_chunk() -> Generator[None, None, None]:
    """While GeminiDDP is built, its "static" placement is the policy above (the name stays "static", which
    GeminiDDP reads to keep chunks on the GPU while it builds them)."""
    from colossalai.zero.gemini.placement_policy import PlacementPolicyFactory

    policies = PlacementPolicyFactory.policies
    # The factory's table is the process's: one build at a time, so two threads cannot restore out of order.
    with _SWAPPING:
        upstream = policies["static"]
        policies["static"] = share_by_chunk_policy()
        try:
            yield
        finally:
            policies["static"] = upstream
