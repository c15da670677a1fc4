"""torchao's float8 weights gathered in float8: one all-reduce for all their scales, before every forward.

A user opts into float8 training in ``configure_model`` (torchao's ``convert_to_float8_training``). With
``Float8LinearConfig(enable_fsdp_float8_all_gather=True)`` FSDP2 gathers those weights in float8, half the bytes of
bf16; each weight then needs its scale (from the largest magnitude of the whole weight, across shards) before its
gather. Left to itself, every weight computes its own with an all-reduce of its own, seven a Llama layer in forward
and again in backward. torchao's ``precompute_float8_dynamic_scale_for_fsdp`` computes them all in one all-reduce,
valid until the weights change. Run before every forward of the root (``forward`` and the Trainer's step methods,
ahead of FSDP2's own all-gathers), it is never older than the weights it scales: after an optimizer step, a
checkpoint load or a user's own change alike.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from torch import nn

__all__ = ["gathers_float8_weights", "scale_float8_weights_before"]


def gathers_float8_weights(module: nn.Module) -> bool:
    """True if FSDP2 gathers some of the module's weights in float8 (torchao's float8 all-gather)."""
    # The weights' class lives in torchao: not imported, no module can hold one (nor is torchao imported for nothing).
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")
    if fsdp_utils is None:
        return False
    float8_weight = fsdp_utils.WeightWithDynamicFloat8CastTensor
    return any(isinstance(getattr(p, "_local_tensor", p), float8_weight) for p in module.parameters())


def scale_float8_weights_before(root: nn.Module, methods: tuple[str, ...] = ("forward",)) -> bool:
    """Compute the scales of the root's float8-gathered weights before each call of ``methods`` (FSDP2 forward
    methods of the root); False, doing nothing, where it gathers none in float8."""
    if not gathers_float8_weights(root):
        return False
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for name in methods:
        if name == "forward":  # ahead of FSDP2's own pre-forward hook, which gathers the root's weights
            root.register_forward_pre_hook(
                lambda module, args: precompute_float8_dynamic_scale_for_fsdp(module), prepend=True
            )
            continue
        # Methods registered with register_fsdp_forward_method run FSDP2's pre-forward themselves, not the hooks.
        setattr(root, name, _scaling_first(root, getattr(root, name), precompute_float8_dynamic_scale_for_fsdp))
    return True


def _scaling_first(root: nn.Module, method: Any, precompute: Any) -> Any:
    @functools.wraps(method)
    def scaled(*args: Any, **kwargs: Any) -> Any:
        precompute(root)
        return method(*args, **kwargs)

    # Lightning's is_overridden unwraps once: it must reach the user's method, not FSDP2's wrapper around it.
    scaled.__wrapped__ = getattr(method, "__wrapped__", method)
    return scaled
