"""The Trainer's XLA strategies on torch_xla 2.9's current API.

They subclass Lightning's XLA strategies, so Lightning's connector still pairs them with the XLA
accelerator and precision, and replace what torch_xla 2.9 deprecates or ignores:
``xm.xla_device()`` -> ``torch_xla.device()``, ``xm.mark_step()`` -> ``torch_xla.sync()``,
``PT_XLA_DEBUG`` -> ``PT_XLA_DEBUG_LEVEL``, and precision through env variables -> dtype conversion.
Checkpoints go through Lightning's ``XLACheckpointIO`` (tensors moved to CPU, written by rank 0),
staged and published in one rename, and are checked before they are read. What they share with the
Fabric strategies is in ``body``.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.precision.xla import XLAPrecision as LightningXLAPrecision
from lightning.pytorch.strategies.single_device import SingleDeviceStrategy
from lightning.pytorch.strategies.single_xla import (
    SingleDeviceXLAStrategy as LightningSingleDeviceXLAStrategy,
)
from lightning.pytorch.strategies.strategy import Strategy
from lightning.pytorch.strategies.xla import XLAStrategy as LightningXLAStrategy
from typing_extensions import override

from lightning_strategies import constructor_for, invalid_name_sentence
from lightning_strategies.checkpoints import check_trainer_checkpoint, remove_checkpoint_path, weights_only_keyword
from lightning_strategies.precision import OwnPrecisionMixin
from lightning_strategies_xla.body import (
    DebugSwitchMixin,
    OneFileCheckpointsMixin,
    SingleDeviceXLABody,
    XLABody,
)
from lightning_strategies_xla.dtypes import forget_stock_environment
from lightning_strategies_xla.precision import XLAPrecision


class _CurrentXLAMixin(OneFileCheckpointsMixin, DebugSwitchMixin, OwnPrecisionMixin):
    """What both strategies change in Lightning's: the precision plugin, the debug switch and checkpoints."""

    @override
    def own_precision_plugin(self, precision: str) -> XLAPrecision:
        forget_stock_environment()
        return XLAPrecision(precision)

    @property  # type: ignore[explicit-override]  # mypy#15900: a property with a setter never counts as marked
    @override
    def precision_plugin(self) -> Any:
        return super().precision_plugin

    @precision_plugin.setter
    def precision_plugin(self, plugin: Any) -> None:
        OwnPrecisionMixin.precision_plugin.fset(self, plugin)  # type: ignore[attr-defined]  # Lightning's become ours
        if self._precision_plugin is not None and not isinstance(self._precision_plugin, LightningXLAPrecision):
            # As Lightning's XLA strategies refuse it, in their words.
            raise TypeError(
                f"The XLA strategy can only work with the `XLAPrecision` plugin, found {plugin}. Pass an XLA "
                "precision plugin, or leave the plugin to the precision flag."
            )

    def setup(self, trainer: Any) -> None:
        # Lightning's setup would set PT_XLA_DEBUG, which torch_xla 2.9 reads only when imported.
        requested, self.debug = self.debug, False
        if requested:
            self._switch_debugging_on()
        try:
            super().setup(trainer)  # type: ignore[misc]
        finally:
            self.debug = requested

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None) -> None:
        with self._staged_target(filepath) as target:
            # Lightning's base write: rank 0, through XLACheckpointIO.
            Strategy.save_checkpoint(self, checkpoint, target, storage_options=storage_options)  # type: ignore[arg-type]

    def remove_checkpoint(self, filepath: _PATH) -> None:
        # Rank 0 alone writes checkpoints, so it alone removes them. Lightning's XLAStrategy removes on
        # every host's local rank 0, which races on a file system the hosts share.
        if self.is_global_zero:
            remove_checkpoint_path(filepath, self.checkpoint_io)

    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> dict[str, Any]:
        self._check_before_load(checkpoint_path)
        checkpoint = super().load_checkpoint(checkpoint_path, **weights_only_keyword(weights_only))  # type: ignore[misc]
        check_trainer_checkpoint(checkpoint, checkpoint_path)
        return checkpoint


class XLAStrategy(XLABody, _CurrentXLAMixin, LightningXLAStrategy):
    """Data parallel over every XLA device of the host (and of the slice), one process per device.

    Args:
        debug: Turn on torch_xla's debug analysis (``PT_XLA_DEBUG_LEVEL``) while this strategy runs.
        sync_module_states: Broadcast rank 0's parameters to every rank after the model is placed.
    """

    strategy_name = "xla"
    # The body's constructor under this class's name (Python's errors for a wrong call name it), with precision
    # named as Lightning's Trainer strategies take it.
    __init__ = constructor_for(__qualname__, XLABody.__init__, precision="precision_plugin")
    precision_keyword = "precision_plugin"


class SingleDeviceXLAStrategy(SingleDeviceXLABody, _CurrentXLAMixin, LightningSingleDeviceXLAStrategy):
    """One XLA device in the Trainer's own process (a TPU core, or PJRT's CPU device).

    Args:
        device: The XLA device index (or ``torch.device("xla", index)``); None picks the first.
        debug: Turn on torch_xla's debug analysis (``PT_XLA_DEBUG_LEVEL``) while this strategy runs.
    """

    strategy_name = "single_xla"
    __init__ = constructor_for(__qualname__, SingleDeviceXLABody.__init__, precision="precision_plugin")

    @override
    def _init_lightning_base(self, device: torch.device, accelerator: Any, checkpoint_io: Any, precision: Any) -> None:
        SingleDeviceStrategy.__init__(self, device, accelerator, checkpoint_io, precision_plugin=precision)
        self._own_precision_given = precision is not None  # what OwnPrecisionMixin's constructor, skipped, would set


class XLAFSDPStrategy:
    """``xla_fsdp`` in the Trainer: refused with the way forward, since only Fabric has it.

    Lightning 2.6's Trainer has no XLA FSDP strategy (Lightning ships ``XLAFSDPStrategy`` for
    Fabric only); ``Fabric(strategy="xla_fsdp")`` resolves to this package's Fabric strategy.
    """

    def __init__(self, **_: Any) -> None:
        raise ValueError(  # Lightning's Trainer calls the name invalid: its sentence first
            f"{invalid_name_sentence('xla_fsdp')} strategy='xla_fsdp' is available in lightning.Fabric only: "
            "Lightning's Trainer has no XLA FSDP strategy. Use Fabric(strategy='xla_fsdp', accelerator=...) for "
            "sharded XLA training, or Trainer(strategy='xla') for data parallel training on XLA devices."
        )
