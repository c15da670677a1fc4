"""The one body of the Trainer and the Fabric XLA strategies: constructors, argument checks, the XLA device, the debug
switch and the checkpoint steps they take alike. ``strategy.py`` and ``fabric.py`` are thin faces over it, each on
Lightning's base classes of its entry point. Nothing here imports ``lightning.pytorch``, so the Fabric face stays free
of Trainer modules.

Each constructor is written once, here, and each face takes a copy under its own name (core's ``constructor_for``,
so a wrong call's error names the class the user called): Fabric's as written, the Trainer's with ``precision`` named
``precision_plugin``, as each entry point's Lightning classes name it.
tests/test_trainer_fabric_agree.py holds the two signatures in agreement.
"""

from __future__ import annotations

import weakref
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from lightning.fabric.accelerators import Accelerator
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.utilities.types import _PATH

from lightning_strategies import check_type
from lightning_strategies.checkpoints import check_checkpoint_file, recover_before_load
from lightning_strategies.checkpoints import staged_checkpoint_io_save as staged_checkpoint
from lightning_strategies.environment_changes import EnvironmentChanges
from lightning_strategies_xla.devices import import_torch_xla
from lightning_strategies_xla.xla_fsdp_checkpoint import refuse_xla_fsdp_shards

# torch_xla 2.9 reads PT_XLA_DEBUG_LEVEL; the older PT_XLA_DEBUG is only looked at on import.
DEBUG_VARIABLE = "PT_XLA_DEBUG_LEVEL"
DEBUG_LEVEL = "2"  # the most detailed analysis: why each graph compiled and executed


def check_arguments(strategy: str, debug: bool, sync_module_states: bool | None = None, **kwargs: Any) -> None:
    """What every constructor checks first: torch_xla is there, and the flags are what they say."""
    import_torch_xla()
    check_type(strategy, "debug", debug, bool)
    if sync_module_states is not None:
        check_type(strategy, "sync_module_states", sync_module_states, bool)
    if kwargs:
        raise TypeError(f"{strategy} got unexpected arguments {sorted(kwargs)}; see help({strategy}).")


def device_index(device: int | torch.device | None) -> int | None:
    """The XLA device index of a ``device`` argument (None: the first device)."""
    if device is None or (isinstance(device, int) and not isinstance(device, bool)):
        return device
    if isinstance(device, torch.device) and device.type == "xla":
        return device.index
    raise TypeError(
        f"SingleDeviceXLAStrategy(device={device!r}) must be an XLA device index or torch.device('xla', i)."
    )


# What debug=True set in os.environ; put back as it was (a level the user set included) when the run ends.
_debug_switch = EnvironmentChanges()


class DebugSwitchMixin:
    """``debug=True`` sets torch_xla 2.9's debug level while the strategy runs; teardown puts back what was there
    (under Fabric, which never tears its strategy down, that happens once the strategy is gone)."""

    debug: bool
    _end_debugging: weakref.finalize | None = None

    def _start_debugging(self) -> None:
        if self.debug:
            self._switch_debugging_on()

    def _switch_debugging_on(self) -> None:
        _debug_switch.set(DEBUG_VARIABLE, DEBUG_LEVEL)
        if self._end_debugging is None or not self._end_debugging.alive:
            self._end_debugging = weakref.finalize(self, _debug_switch.restore)

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        if self._end_debugging is not None:
            self._end_debugging()


class LaunchedDeviceMixin:
    """One process per XLA device: the device is the launched process's own."""

    _launched: bool

    @property
    def root_device(self) -> torch.device:
        if not self._launched:
            raise RuntimeError(
                "Accessing the XLA device before processes have spawned is not allowed. The XLA device exists only "
                "inside the launched processes: ask for it there, once the strategy's environment is set up."
            )
        import torch_xla

        return torch_xla.device()


class OneDeviceMixin:
    """One XLA device in this process, created when first asked for. Lightning's single-device strategies create it
    with the deprecated ``xm.xla_device()`` at construction; their base takes a placeholder instead."""

    _device_index: int | None
    _xla_device: torch.device | None = None

    def _placeholder_device(self, device: int | torch.device | None) -> torch.device:
        self._device_index = device_index(device)
        return torch.device("xla", self._device_index or 0)

    @property
    def root_device(self) -> torch.device:
        if self._xla_device is None:
            import torch_xla

            self._xla_device = torch_xla.device(self._device_index)
        return self._xla_device


class XLABody(LaunchedDeviceMixin):
    """The constructor of both entry points' ``XLAStrategy``."""

    # The keyword each entry point's XLAStrategy takes the precision plugin by: "precision_plugin" or "precision".
    precision_keyword: ClassVar[str]
    debug: bool

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        debug: bool = False,
        sync_module_states: bool = True,
        **kwargs: Any,
    ) -> None:
        """``kwargs`` are refused by name: Lightning's Trainer strategy would drop them silently."""
        check_arguments("XLAStrategy", debug, sync_module_states, **kwargs)
        super().__init__(  # type: ignore[call-arg]  # Lightning's strategy, after this mixin
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            checkpoint_io=checkpoint_io,
            sync_module_states=sync_module_states,
            **{self.precision_keyword: precision},
        )
        self.debug = debug


class SingleDeviceXLABody(OneDeviceMixin):
    """The constructor of both entry points' ``SingleDeviceXLAStrategy``."""

    debug: bool

    def __init__(
        self,
        device: int | torch.device | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        debug: bool = False,
    ) -> None:
        check_arguments("SingleDeviceXLAStrategy", debug)
        self._init_lightning_base(self._placeholder_device(device), accelerator, checkpoint_io, precision)
        self.debug = debug

    def _init_lightning_base(
        self, device: torch.device, accelerator: Any, checkpoint_io: Any, precision: Precision | None
    ) -> None:
        """The face's Lightning ``SingleDeviceStrategy.__init__``: not its XLA strategy's, which creates the device
        with the deprecated ``xm.xla_device()`` at construction."""
        raise NotImplementedError


class OneFileCheckpointsMixin:
    """Checkpoints of one file that rank 0 writes through the CheckpointIO plugin: staged and published in one rename,
    checked before they are read."""

    checkpoint_io: Any
    is_global_zero: bool
    barrier: Any

    @contextmanager
    def _staged_target(self, path: _PATH) -> Generator[Any, None, None]:
        """Where rank 0 writes; renamed into place once every rank is done, so a crash mid-save leaves the previous
        checkpoint under the name."""
        import torch_xla

        # Every rank runs its pending graph first: the weights are current and no rank waits in a collective the
        # others skipped. (Lightning's XLAStrategy.save_checkpoint would call the deprecated xm.mark_step.)
        torch_xla.sync()
        with staged_checkpoint(path, self.checkpoint_io, self.is_global_zero, self.barrier) as target:
            yield target

    def _check_before_load(self, path: _PATH) -> None:
        """A folder (another strategy's, named with its conversion), or a missing, empty or truncated file, ends in
        a CheckpointError before Lightning reads it."""
        recover_before_load(path, self.is_global_zero, self.barrier)
        refuse_xla_fsdp_shards(path, type(self).__name__)
        check_checkpoint_file(path, self.checkpoint_io, type(self).__name__)
