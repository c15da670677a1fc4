"""Gemini's static placement, offloading the share of chunks it is asked to.

ColossalAI 0.5.0's StaticPlacementPolicy sizes the offloaded share against the memory of every chunk counted once
per parameter it holds (``setup_grads_device`` sums ``get_chunk(p).chunk_mem`` over parameters), then walks the
chunks once each. Its target is therefore many times the real total, and every ``offload_optim_frac`` we tried
offloaded every chunk's optimizer side: measured on an H200, a 2.7B GPT asked to offload 45% held 14 bytes per
parameter on the host, as full offload does, and a 13B one was killed for host memory. The policy here counts
each chunk once and walks them in the model's order, so every rank picks the same chunks. (``offload_param_frac``
is sized the same way; the strategy takes only 0 or 1 for it, since Gemini moves parameter chunks all or none.)

Unless told not to pin, the policy also pins the host copy of each offloaded chunk, and only those. Unpinned,
backward copied each offloaded chunk's gradients into freshly allocated pageable memory, synchronously: a 13B
GPT with 60% offloaded spent about 10 s of each step's backward so (measured on an H200: forward and backward
took 14.3 s for 16 sequences and 18.9 s for 32). Pinning every chunk, ColossalAI's way, holds a host copy of
the GPU-held ones too, which a model that needs offloading cannot spare.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator
from typing import Any

from lightning_strategies.pinned import PinningError, pin_exactly

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


def share_by_chunk_policy(pin_offloaded: bool = False, pin: Callable[[int, Any], Any] = pin_exactly) -> type:
    """StaticPlacementPolicy with the offloaded shares measured over distinct chunks; with ``pin_offloaded``, the
    offloaded chunks' host copies are allocated once, page-locked, by ``pin``."""
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
            if pin_offloaded:
                for chunk in offloaded:
                    if not chunk.pin_memory:
                        # A pinned chunk keeps its host copy and copies into it (Chunk.shard_move).
                        try:
                            chunk.cpu_shard = pin(chunk.shard_size, chunk.dtype)
                        except PinningError as error:
                            raise PinningError(
                                f"{error} Pass pin_memory=False to keep the offloaded chunks in pageable memory."
                            ) from error
                        chunk.pin_memory = True
            total = sum(chunk.chunk_mem for chunk in chunks)
            self.keep_gathered_chunk_mem = total * (1 - self.shard_param_frac)
            self.keep_cuda_chunk_mem = total * (1 - self.offload_param_frac)

    return ShareByChunkPlacementPolicy


@contextlib.contextmanager
def static_placement_by_chunk(pin_offloaded: bool = False) -> Generator[None, None, None]:
    """While GeminiDDP is built, its "static" placement is the policy above (the name stays "static", which
    GeminiDDP reads to keep chunks on the GPU while it builds them)."""
    from colossalai.zero.gemini.placement_policy import PlacementPolicyFactory

    policies = PlacementPolicyFactory.policies
    # The factory's table is the process's: one build at a time, so two threads cannot restore out of order.
    with _SWAPPING:
        upstream = policies["static"]
        policies["static"] = share_by_chunk_policy(pin_offloaded)
        try:
            yield
        finally:
            policies["static"] = upstream
