"""The Trainer's precision plugin for DeepSpeed: backward and step go through the engine.

Lightning decides where an accumulation window ends (so hooks, schedulers and ``global_step``
see real optimizer steps); this plugin tells the engine, so DeepSpeed reduces and steps there.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from lightning.fabric.utilities.types import Steppable
from lightning.pytorch.plugins.precision import DeepSpeedPrecision as LightningDeepSpeedPrecision
from lightning_utilities.core.apply_func import apply_to_collection
from typing_extensions import override

from lightning_strategies_deepspeed.body import DTYPES
from lightning_strategies_deepspeed.config import DeepSpeedConfigurationError


# Subclassing Lightning's plugin (every method of which is overridden here) lets the places that check for it by
# class, such as ThroughputMonitor finding the compute dtype, treat ours as theirs.
class DeepSpeedPrecision(LightningDeepSpeedPrecision):
    """DeepSpeed keeps its own fp32 master weights in fp16/bf16 mode; Lightning only casts inputs."""

    def __init__(self, precision: str = "32-true") -> None:
        super().__init__(precision)  # type: ignore[arg-type]  # Lightning's refuses the flags DeepSpeed has no dtype for
        self.dtype = DTYPES[self.precision]
        self._in_optimizer_step = False

    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.precision.endswith("-true"):
            return module.to(dtype=self.dtype)
        return module  # in mixed mode the engine converts the module and keeps fp32 masters

    @override
    def convert_input(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor, _to_floating_dtype, self.dtype)

    @override
    def tensor_init_context(self) -> AbstractContextManager:
        return _DefaultDtype(self.dtype) if self.precision.endswith("-true") else nullcontext()

    @override
    def module_init_context(self) -> AbstractContextManager:
        return self.tensor_init_context()

    @override
    def backward(self, tensor: torch.Tensor, model: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        engine = model.trainer.model
        if not model.automatic_optimization:
            engine.backward(tensor, *args, **kwargs)  # the user steps; DeepSpeed counts micro-steps itself
            return
        boundary = self._in_optimizer_step
        engine.set_gradient_accumulation_boundary(boundary)
        # Lightning already divided the loss by accumulate_grad_batches.
        engine.backward(tensor, *args, scale_wrt_gas=False, **kwargs)
        if not boundary:
            engine.step()  # advances DeepSpeed's micro-step bookkeeping; no update off the boundary

    # The Trainer's signature, which narrows Fabric's as Lightning's own Trainer Precision does.
    @override
    def optimizer_step(  # type: ignore[override]
        self, optimizer: Steppable, model: Any, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        if isinstance(optimizer, torch.optim.LBFGS):
            raise DeepSpeedConfigurationError(
                "DeepSpeed and the LBFGS optimizer are not compatible. The engine cannot drive LBFGS, whose step "
                "re-evaluates the closure: use another optimizer."
            )
        self._in_optimizer_step = True
        try:
            closure_result = closure()
        finally:
            self._in_optimizer_step = False
        self._after_closure(model, optimizer)
        if model.automatic_optimization and closure_result is None:
            raise DeepSpeedConfigurationError(
                "Skipping backward by returning `None` from your `training_step` is not supported by `DeepSpeed`. "
                "Every rank must take part in each step: return a loss on every rank."
            )
        return model.trainer.model.step(**kwargs)

    @override
    def clip_gradients(self, optimizer: Any, clip_val: Any = 0.0, gradient_clip_algorithm: Any = None) -> None:
        """DeepSpeed clips inside ``engine.step()`` from the config's ``gradient_clipping``."""


def _to_floating_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if torch.is_floating_point(tensor) else tensor


class _DefaultDtype(AbstractContextManager):
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    @override
    def __enter__(self) -> None:
        self.previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    @override
    def __exit__(self, *exc: Any) -> None:
        torch.set_default_dtype(self.previous)
