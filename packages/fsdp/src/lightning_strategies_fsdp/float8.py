"""torchao's float8 weights gathered in float8: one all-reduce for all their scales, before every forward.

A user opts into float8 training in ``configure_model`` (torchao's ``convert_to_float8_training``). With
``Float8LinearConfig(enable_fsdp_float8_all_gather=True)`` FSDP2 gathers those weights in float8, half the bytes of
bf16; each gather needs its weight's scale, from the largest magnitude of the whole weight across shards. Left to
itself, every weight computes its own in an all-reduce of its own, seven a Llama layer in forward and again in
backward. torchao's ``precompute_float8_dynamic_scale_for_fsdp`` computes them all in one all-reduce, valid until
the weights change. The strategies run it before each call of the root's ``forward`` and of the Trainer's step
methods, ahead of FSDP2's own all-gathers, and drop the scales after every step of the optimizers they set up (a
hook on the optimizer, whichever way it is stepped), so that a forward the root does not start (a model run again
inside one ``training_step``) computes its own as torchao does by itself. Offloaded weights are left to torchao:
FSDP2 gathers a copy on the GPU, which does not carry a scale computed ahead.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from torch import Tensor, nn
from torch.optim import Optimizer

__all__ = ["drop_float8_scales_after_steps", "gathers_float8_weights", "scale_float8_weights_before"]

# On the wrappers this project sets on a root's methods: (what the instance held before, None for the class's own),
# so that a later set-up (every trainer call on the same model) takes them off again (unwrap_method).
WRAPPER_MARK = "_lightning_strategies_replaced"
HOOK_HANDLE = "_lightning_strategies_float8_hook"


def _float8_gathered(parameters: Iterable[Tensor]) -> Iterator[Tensor]:
    """The local shards of those ``parameters`` that FSDP2 gathers in float8."""
    # The class lives in torchao: not imported, no parameter can be one (nor is torchao imported for nothing).
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")
    if fsdp_utils is None:
        return
    for parameter in parameters:
        local = getattr(parameter, "_local_tensor", parameter)
        if isinstance(local, fsdp_utils.WeightWithDynamicFloat8CastTensor):
            yield local


def gathers_float8_weights(module: nn.Module) -> bool:
    """True if FSDP2 gathers some of the module's weights in float8 (torchao's float8 all-gather)."""
    return next(_float8_gathered(module.parameters()), None) is not None


def scale_float8_weights_before(root: nn.Module, methods: tuple[str, ...] = ("forward",)) -> bool:
    """Compute the scales of the root's float8-gathered weights before each call of ``methods`` (FSDP2 forward
    methods of the root); False, doing nothing, where it gathers none in float8."""
    if "forward" in methods and (previous := root.__dict__.pop(HOOK_HANDLE, None)) is not None:
        previous.remove()  # an earlier set-up's
    if not gathers_float8_weights(root):
        return False
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for name in methods:
        if name == "forward":  # ahead of FSDP2's own pre-forward hook, which gathers the root's weights
            root.__dict__[HOOK_HANDLE] = root.register_forward_pre_hook(
                lambda module, args: precompute_float8_dynamic_scale_for_fsdp(module), prepend=True
            )
            continue
        # Methods registered with register_fsdp_forward_method run FSDP2's pre-forward themselves, not the hooks.
        setattr(root, name, _scaling_first(root, name, precompute_float8_dynamic_scale_for_fsdp))
    return True


def drop_float8_scales_after_steps(optimizer: Optimizer) -> None:
    """After each step of ``optimizer`` the scales computed ahead for its float8-gathered weights are stale: drop them,
    so that a gather before the next computation ahead takes its own. Hooked whatever it holds now: float8 weights
    may join it later (``add_param_group``, as Lightning's ``BaseFinetuning`` unfreezes a backbone)."""
    optimizer.register_step_post_hook(_forget_float8_scales)


def _forget_float8_scales(optimizer: Optimizer, args: Any, kwargs: Any) -> None:
    for local in _float8_gathered(parameter for group in optimizer.param_groups for parameter in group["params"]):
        local._precomputed_scale = None  # type: ignore[attr-defined]


def unwrap_method(module: nn.Module, name: str) -> None:
    """Take off the wrappers this project set on ``module.name``, restoring what the instance held before."""
    while (mark := getattr(module.__dict__.get(name), WRAPPER_MARK, None)) is not None:
        (replaced,) = mark
        if replaced is None:
            del module.__dict__[name]
        else:
            module.__dict__[name] = replaced


def _scaling_first(root: nn.Module, name: str, precompute: Any) -> Any:
    method = getattr(root, name)

    @functools.wraps(method)
    def scaled(*args: Any, **kwargs: Any) -> Any:
        precompute(root)
        return method(*args, **kwargs)

    # Lightning's is_overridden unwraps once: it must reach the user's method, not FSDP2's wrapper around it.
    scaled.__wrapped__ = getattr(method, "__wrapped__", method)
    scaled.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    setattr(scaled, WRAPPER_MARK, (root.__dict__.get(name),))
    return scaled
