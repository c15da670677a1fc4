"""The Trainer's XLA precision plugin: dtype conversion instead of env variables, and torch_xla.sync()."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.types import Optimizable
from lightning.pytorch.plugins.precision.xla import XLAPrecision as LightningXLAPrecision
from typing_extensions import override

from lightning_strategies_xla.devices import import_torch_xla
from lightning_strategies_xla.dtypes import DtypeConversionMixin


class SkippedBackwardError(MisconfigurationException, RuntimeError):
    """A training_step that returned None: a MisconfigurationException, as Lightning's XLA plugin raises, and a
    RuntimeError, as ours raised before."""


class XLAPrecision(DtypeConversionMixin, LightningXLAPrecision):
    """``"32-true"``, ``"bf16-true"`` or ``"16-true"`` on an XLA device.

    A subclass of Lightning's plugin so that Lightning's checks still recognise it as XLA's.
    """

    def __init__(self, precision: str = "32-true") -> None:  # Lightning's __init__ sets the env variables
        import_torch_xla()
        self._choose_precision(precision)

    @override
    def optimizer_step(  # type: ignore[override]
        self, optimizer: Optimizable, model: pl.LightningModule, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        import torch_xla

        closure = partial(self._xla_wrap_closure, optimizer, closure)
        closure = partial(self._wrap_closure, model, optimizer, closure)
        result = optimizer.step(closure=closure, **kwargs)
        # Cut the lazy graph once per step: one compiled program per step, not one per epoch.
        torch_xla.sync()
        if model.automatic_optimization and result is None:
            raise SkippedBackwardError(  # Lightning's first sentence; its second asks for an issue in its tracker
                "Skipping backward by returning `None` from your `training_step` is not implemented with XLA. The XLA "
                "strategies need a loss every step, because each step is compiled as one program: return the loss, "
                "or use manual optimization."
            )
        return result

    @override
    def teardown(self) -> None:
        pass  # no process-wide state to undo: nothing was set in os.environ
