"""ColossalAI Gemini for PyTorch Lightning: ``Trainer(strategy="colossalai")`` on ColossalAI 0.5.

Importing this package is cheap; the strategy (and colossalai) load when a name is resolved or
``ColossalAIStrategy`` is used, from here, from ``lightning_strategies_colossalai.strategy``, or from
``lightning.pytorch.strategies`` and ``pytorch_lightning.strategies``, where Lightning 1.x had it.
"""

from lightning_strategies.backends import lazy_exports
from lightning_strategies_colossalai.version import __version__

_LAZY = {"ColossalAIStrategy": "lightning_strategies_colossalai.strategy"}

__all__ = ["__version__", *_LAZY]
__getattr__ = lazy_exports(__name__, _LAZY)
