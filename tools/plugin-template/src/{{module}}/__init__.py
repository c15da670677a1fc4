"""The {{name}} strategy for PyTorch Lightning, found by lightning-strategies through an entry point.

Kept light on purpose: the strategy class lives in {{module}}.strategy and is imported only
when ``"{{name}}"`` is used.
"""

from {{module}}.version import __version__

__all__ = ["__version__"]
