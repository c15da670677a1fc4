"""Fabric's XLA strategies on torch_xla 2.9's current API (see strategy.py for the Trainer's).

Subclasses of Lightning's Fabric strategies, so Fabric's connector pairs them with its XLA
accelerator and precision, with ``torch_xla.device()`` for ``xm.xla_device()``,
``torch_xla.sync()`` for ``xm.mark_step()`` and dtype conversion for precision env variables.
Checkpoints are staged and published in one rename, and checked before they are read. What they share with the
Trainer strategies is in ``body``; this module imports none of the Trainer's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.precision.xla import XLAPrecision as LightningFabricXLAPrecision
from lightning.fabric.strategies.single_device import SingleDeviceStrategy
from lightning.fabric.strategies.single_xla import SingleDeviceXLAStrategy as LightningSingleDeviceXLAStrategy
from lightning.fabric.strategies.strategy import Strategy
from lightning.fabric.strategies.xla import XLAStrategy as LightningXLAStrategy
from lightning.fabric.strategies.xla_fsdp import XLAFSDPStrategy as LightningXLAFSDPStrategy
from lightning.fabric.utilities.types import _PATH, Optimizable
from typing_extensions import override

from lightning_strategies import constructor_for
from lightning_strategies.checkpoints import (
    recover_before_load,
    staged_save,
    weights_only_keyword,
)
from lightning_strategies.precision import is_stock_precision
from lightning_strategies_xla.body import (
    DebugSwitchMixin,
    LaunchedDeviceMixin,
    OneFileCheckpointsMixin,
    SingleDeviceXLABody,
    XLABody,
)
from lightning_strategies_xla.devices import import_torch_xla
from lightning_strategies_xla.dtypes import DtypeConversionMixin, forget_stock_environment
from lightning_strategies_xla.xla_fsdp_checkpoint import check_xla_fsdp_checkpoint


class XLAPrecision(DtypeConversionMixin, LightningFabricXLAPrecision):
    """Fabric's ``"32-true"``, ``"bf16-true"`` or ``"16-true"`` on an XLA device, without env variables."""

    def __init__(self, precision: str = "32-true") -> None:
        import_torch_xla()
        self._choose_precision(precision)

    @override
    def teardown(self) -> None:
        pass  # nothing was set in os.environ


class _CurrentXLAMixin(DebugSwitchMixin):
    """Keeps our precision plugin where Fabric's connector assigns its stock one, and the debug switch."""

    _precision: Any
    # How Lightning's strategy of the same name calls itself where it refuses a precision plugin.
    _lightnings_name = "XLA"

    @property
    def precision(self) -> XLAPrecision:
        return self._precision if self._precision is not None else XLAPrecision()

    @precision.setter
    def precision(self, plugin: Any) -> None:
        if is_stock_precision(plugin):
            forget_stock_environment()
            plugin = XLAPrecision(plugin.precision)
        if plugin is not None and not isinstance(plugin, LightningFabricXLAPrecision):
            raise TypeError(
                f"The {self._lightnings_name} strategy can only work with the `XLAPrecision` plugin, found {plugin}. "
                "Pass an XLA precision plugin, or leave the plugin to the precision flag."
            )
        self._precision = plugin

    def setup_environment(self) -> None:
        self._start_debugging()
        super().setup_environment()  # type: ignore[misc]


class _OneFileCheckpointsMixin(OneFileCheckpointsMixin):
    """Fabric's checkpoint methods over the body's staged writes and checks."""

    def save_checkpoint(
        self,
        path: _PATH,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: Any | None = None,
    ) -> None:
        with self._staged_target(path) as target:
            # Lightning's base write: rank 0, through XLACheckpointIO.
            Strategy.save_checkpoint(self, target, state, storage_options=storage_options, filter=filter)  # type: ignore[arg-type]

    def load_checkpoint(
        self,
        path: _PATH,
        state: Any = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        self._check_before_load(path)
        return super().load_checkpoint(path, state, strict=strict, **weights_only_keyword(weights_only))  # type: ignore[misc]


class XLAStrategy(XLABody, _OneFileCheckpointsMixin, _CurrentXLAMixin, LightningXLAStrategy):
    """Fabric's data parallel over every XLA device, one process per device (``debug``, ``sync_module_states``)."""

    # The body's constructor under this class's name, which Python's errors for a wrong call then name.
    __init__ = constructor_for(__qualname__, XLABody.__init__)
    precision_keyword = "precision"


class SingleDeviceXLAStrategy(
    SingleDeviceXLABody, _OneFileCheckpointsMixin, _CurrentXLAMixin, LightningSingleDeviceXLAStrategy
):
    """Fabric on one XLA device; ``device`` is an index (None: the first)."""

    # The body's constructor under this class's name, which Python's errors for a wrong call then name.
    __init__ = constructor_for(__qualname__, SingleDeviceXLABody.__init__)

    @override
    def _init_lightning_base(self, device: torch.device, accelerator: Any, checkpoint_io: Any, precision: Any) -> None:
        SingleDeviceStrategy.__init__(self, device, accelerator, checkpoint_io, precision)


class XLAFSDPStrategy(LaunchedDeviceMixin, _CurrentXLAMixin, LightningXLAFSDPStrategy):
    """torch_xla's fully sharded data parallel in Fabric; keyword arguments go to ``XlaFullyShardedDataParallel``.

    Takes Lightning's parameters (``auto_wrap_policy``, ``activation_checkpointing_policy``,
    ``state_dict_type`` "full" or "sharded", ``sequential_save``).
    """

    debug = False
    _lightnings_name = "XLA FSDP"

    @override
    def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
        import torch_xla

        # Sharded gradients are already reduced by XLA FSDP; only the step's graph is cut here.
        loss = optimizer.step(**kwargs)
        torch_xla.sync()
        return loss

    @override
    def save_checkpoint(
        self,
        path: _PATH,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: Any | None = None,
    ) -> None:
        """Every process writes its shard (or rank 0 the consolidated file) beside ``path``; the checkpoint
        is renamed into place once all are done, so a crash mid-save leaves the previous one whole.

        Saving over an existing checkpoint replaces it. (Lightning refuses a non-empty folder, where new
        shards would mix with old ones; the new checkpoint is written apart and swapped in whole instead.)
        """
        target = Path(self.broadcast(path))
        with staged_save(target, self.is_global_zero, self.barrier) as staged:
            super().save_checkpoint(staged, state, storage_options=storage_options, filter=filter)

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        state: Any = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Check the shards (their world size against this run's) or the full file before Lightning reads them."""
        target = Path(self.broadcast(path))
        recover_before_load(target, self.is_global_zero, self.barrier)
        check_xla_fsdp_checkpoint(target, self._state_dict_type, self.world_size)
        return super().load_checkpoint(target, state, strict=strict, **weights_only_keyword(weights_only))
