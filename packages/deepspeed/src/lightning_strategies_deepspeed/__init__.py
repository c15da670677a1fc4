"""DeepSpeed ZeRO for PyTorch Lightning on today's DeepSpeed, on CUDA GPUs and on CPU.

Importing this package is cheap: the strategy classes (and torch, Lightning, deepspeed) are
imported only when one of them is used.
"""

from lightning_strategies.backends import lazy_exports
from lightning_strategies_deepspeed.version import __version__

_LAZY = {
    "DeepSpeedStrategy": "lightning_strategies_deepspeed.strategy",
    "DeepSpeedFabricStrategy": "lightning_strategies_deepspeed.fabric",
    "convert_zero_checkpoint": "lightning_strategies_deepspeed.checkpoint",
    "convert_to_universal": "lightning_strategies_deepspeed.checkpoint",
}

__all__ = ["__version__", *_LAZY]
__getattr__ = lazy_exports(__name__, _LAZY)
