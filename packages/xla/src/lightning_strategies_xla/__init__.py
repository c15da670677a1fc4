"""PyTorch/XLA strategies for Lightning on torch_xla 2.9: xla, xla_debug, single_xla, xla_fsdp.

Importing this package imports neither torch nor torch_xla; the classes are loaded on first use.
"""

from lightning_strategies.backends import lazy_exports
from lightning_strategies_xla.version import __version__

_LAZY = {
    "XLAAccelerator": "lightning_strategies_xla.accelerator",
    "XLAPrecision": "lightning_strategies_xla.precision",
    "XLAStrategy": "lightning_strategies_xla.strategy",
    "SingleDeviceXLAStrategy": "lightning_strategies_xla.strategy",
    "XLAFSDPStrategy": "lightning_strategies_xla.strategy",
}

__all__ = ["__version__", *_LAZY]
__getattr__ = lazy_exports(__name__, _LAZY)
