"""Lightning's precision plugins for FSDP2: clipping by norm over sharded gradients, and a
"bf16-mixed" that leaves the casting to FSDP2.

Clipping: Lightning's plugins call torch's ``clip_grad_norm_``, whose reduction fails for CPU-offloaded
shards on a CUDA mesh (see clipping.py); every plugin here clips through clipping.py instead.


FSDP2's MixedPrecisionPolicy already runs forward and backward on bf16 copies of the fp32
shards. Lightning's stock plugin would also wrap every step in ``torch.autocast``, which re-casts
activations for autocast's fp32 op list (norms, softmax, losses): on a 1.3B GPT on one H200 that
cost about 4% throughput against ``fully_shard`` by hand. "16-mixed" keeps Lightning's plugin:
fp16 needs its gradient scaler and autocast's fp32 islands to avoid overflow.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision
from torch.optim import Optimizer
from typing_extensions import override

from lightning_strategies_fsdp.clipping import clip_grad_norm_


class ShardedClippingMixin:
    """Clips by norm with the total norm summed shard by shard (clipping.py)."""

    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: int | float) -> None:
        clip_grad_norm_(self.main_params(optimizer), clip_val)  # type: ignore[attr-defined]


class FSDP2Precision(ShardedClippingMixin, Precision):
    """ "32-true"."""


class FSDP2HalfPrecision(ShardedClippingMixin, HalfPrecision):
    """ "16-true" and "bf16-true"."""


class FSDP2MixedPrecision(ShardedClippingMixin, MixedPrecision):
    """ "16-mixed": Lightning's autocast and gradient scaler (which unscales before clipping)."""


class FSDP2BF16MixedPrecision(FSDP2MixedPrecision):
    """ "bf16-mixed" whose casting is left to FSDP2's MixedPrecisionPolicy."""

    def __init__(self, device: str = "cuda") -> None:
        super().__init__("bf16-mixed", device)

    @contextmanager
    @override
    def forward_context(self) -> Iterator[None]:
        yield
