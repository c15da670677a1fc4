"""Training strategies for PyTorch Lightning as plugins: a shared registry, discovery by entry
point, and activation so that ``Trainer(strategy="name")`` works without an import.

Importing this package is cheap (no torch, no Lightning); the registry is filled on first use.

The supported API for plugin authors is ``__all__`` here and in the modules named in
``PUBLIC_MODULES`` (docs/plugin-authoring.md, "What a plugin may import"); every other module
and name is internal and may change in any release.
"""

from lightning_strategies.activation import activate, invalid_name_sentence, watched_modules
from lightning_strategies.entries import StrategyEntry
from lightning_strategies.errors import (
    CapabilityError,
    CheckpointError,
    CheckpointNotFoundError,
    MissingBackendError,
    StrategyConflictError,
    StrategyLookupError,
)
from lightning_strategies.hookspecs import hookimpl
from lightning_strategies.parameters import (
    ObsoleteParameterWarning,
    check_choice,
    check_type,
    constructor_for,
    warn_obsolete_parameter,
)
from lightning_strategies.planning import plan
from lightning_strategies.registry import get_registry
from lightning_strategies.version import __version__

# Modules whose ``__all__`` is supported API besides this package's own; the names are strings so that
# listing them imports nothing (most of them import torch).
PUBLIC_MODULES = (
    "lightning_strategies.backends",
    "lightning_strategies.checkpoints",
    "lightning_strategies.hugging_face",
    "lightning_strategies.conformance",
    "lightning_strategies.conformance.hugging_face",
    "lightning_strategies.conformance.launching",
    "lightning_strategies.environment_changes",
    "lightning_strategies.pinned",
    "lightning_strategies.planning",
    "lightning_strategies.precision",
    "lightning_strategies.ranks",
    "lightning_strategies.speed",
    "lightning_strategies.testing",
)

__all__ = [
    "PUBLIC_MODULES",
    "CapabilityError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "MissingBackendError",
    "ObsoleteParameterWarning",
    "StrategyConflictError",
    "StrategyEntry",
    "StrategyLookupError",
    "__version__",
    "activate",
    "check_choice",
    "check_type",
    "constructor_for",
    "get_registry",
    "hookimpl",
    "invalid_name_sentence",
    "plan",
    "warn_obsolete_parameter",
    "watched_modules",
]
