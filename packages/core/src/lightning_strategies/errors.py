"""Errors users meet, each phrased to say what to do next."""

from __future__ import annotations


class StrategyLookupError(ValueError, KeyError):
    """A strategy name that nothing registered (a typo, or a package that is not installed).

    A ValueError like Lightning's own "invalid strategy name", and a KeyError like a registry miss,
    so existing ``except`` clauses of either kind still catch it.
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StrategyConflictError(RuntimeError):
    """Two installed distributions claim the same strategy name."""


class CapabilityError(ValueError):
    """A strategy was asked for an accelerator, precision or optimizer it declares it cannot use."""


class MissingBackendError(ImportError):
    """The library a strategy drives (deepspeed, colossalai, torch_xla) is missing or out of range."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: missing, truncated, corrupted, or from another strategy
    or world size that this one cannot read."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No checkpoint a strategy reads at the path; a FileNotFoundError too, as Lightning's strategies raise there."""
