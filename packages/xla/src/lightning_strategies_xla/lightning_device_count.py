"""Makes Lightning's own XLAAccelerator count devices locally (for core's activation to apply).

Even with this package's accelerator, ``Trainer.__init__`` logs "TPU available: ..." through
Lightning's ``XLAAccelerator.is_available()``, and ``accelerator="auto"`` asks it too; both
reach the GCE metadata server through torch_xla (see devices.py). No accelerator argument avoids
that call, so the one fix is to give Lightning's class this package's local count. The plugin's
``lightning_module_imported`` hook applies it as soon as ``lightning.fabric.accelerators.xla``
(or ``lightning_fabric.accelerators.xla``) is imported.
"""

from __future__ import annotations

import functools
from types import ModuleType


def count_devices_locally(module: ModuleType) -> None:
    """Point ``module.XLAAccelerator``'s device count (and availability) at ``devices.local_device_count``."""
    from lightning_strategies_xla.devices import local_device_count

    accelerator = module.XLAAccelerator
    if getattr(accelerator, "_counts_devices_locally", False):
        return

    @functools.lru_cache(maxsize=1)
    def auto_device_count() -> int:
        return local_device_count()

    @functools.lru_cache(maxsize=1)
    def is_available() -> bool:
        try:
            return auto_device_count() > 0
        except (ValueError, OSError, ImportError):  # ImportError: torch_xla is not installed at all
            return False

    accelerator.auto_device_count = staticmethod(auto_device_count)
    accelerator.is_available = staticmethod(is_available)
    accelerator._counts_devices_locally = True
