"""Training strategies for PyTorch Lightning as plugins: a shared registry, discovery by entry
point, and activation so that ``Trainer(strategy="name")`` works without an import.

Importing this package is cheap (no torch, no Lightning); the registry is filled on first use.
"""

from lightning_strategies.activation import activate
from lightning_strategies.errors import (
    CapabilityError,
    CheckpointError,
    MissingBackendError,
    StrategyConflictError,
    StrategyLookupError,
)
from lightning_strategies.hookspecs import hookimpl
from lightning_strategies.parameters import warn_obsolete_parameter
from lightning_strategies.planning import plan
from lightning_strategies.registry import StrategyEntry, get_registry
from lightning_strategies.version import __version__

__all__ = [
    "CapabilityError",
    "CheckpointError",
    "MissingBackendError",
    "StrategyConflictError",
    "StrategyEntry",
    "StrategyLookupError",
    "__version__",
    "activate",
    "get_registry",
    "hookimpl",
    "plan",
    "warn_obsolete_parameter",
]
