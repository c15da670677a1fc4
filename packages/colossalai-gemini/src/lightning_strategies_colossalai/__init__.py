"""ColossalAI Gemini for PyTorch Lightning: ``Trainer(strategy="colossalai")`` on ColossalAI 0.5.

Importing this package is cheap; the strategy (and colossalai) load when a name is resolved or
``lightning_strategies_colossalai.strategy`` is imported.
"""

from lightning_strategies_colossalai.version import __version__

__all__ = ["__version__"]
