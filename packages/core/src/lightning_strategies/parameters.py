"""Shared checks for strategy constructor parameters, so every package words them alike."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any


class ObsoleteParameterWarning(UserWarning):
    """A parameter from an older API that today's backend no longer uses."""


def warn_obsolete_parameter(strategy: str, parameter: str, value: Any, reason: str, stacklevel: int = 3) -> None:
    """Accept ``parameter`` but say why it has no effect any more (and what replaced it).

    ``stacklevel`` counts from this function: the default points at the caller's caller, the
    user's constructor call when a strategy's ``__init__`` warns directly.
    """
    warnings.warn(
        f"{strategy}({parameter}={value!r}) has no effect: {reason}",
        ObsoleteParameterWarning,
        stacklevel=stacklevel,
    )


def check_choice(strategy: str, parameter: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``allowed``; otherwise raise with the allowed values."""
    allowed = tuple(allowed)
    if value not in allowed:
        choices = ", ".join(repr(choice) for choice in allowed)
        raise ValueError(f"{strategy}({parameter}={value!r}) is not valid. Choose one of: {choices}.")
    return value


def check_type(strategy: str, parameter: str, value: Any, expected: type | tuple[type, ...]) -> Any:
    """Return ``value`` if it is an instance of ``expected``; otherwise raise naming the type wanted."""
    if not isinstance(value, expected) or (isinstance(value, bool) and bool not in _as_tuple(expected)):
        names = " or ".join(kind.__name__ for kind in _as_tuple(expected))
        raise TypeError(f"{strategy}({parameter}={value!r}) must be {names}, not {type(value).__name__}.")
    return value


def _as_tuple(expected: type | tuple[type, ...]) -> tuple[type, ...]:
    return expected if isinstance(expected, tuple) else (expected,)
