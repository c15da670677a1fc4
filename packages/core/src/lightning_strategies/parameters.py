"""Shared checks for strategy constructor parameters, so every package words them alike."""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Iterable
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


def rename_parameter(function: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
    """``function`` with its parameter ``old`` called ``new``: the same code, defaults and annotations.

    For a constructor written once in the body a Trainer and a Fabric strategy share, where the two Lightning base
    classes name one parameter differently (``precision_plugin`` and ``precision``). The copy is a plain function,
    not a wrapper over ``**kwargs``, so ``inspect.signature``, LightningCLI and ``lightning-strategies info`` read
    the face's full signature, and a call with the other entry point's name is refused as Python refuses any
    unknown keyword.
    """
    code = function.__code__
    arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if old not in arguments or new in code.co_varnames:
        raise ValueError(
            f"rename_parameter({function.__qualname__}, {old!r}, {new!r}): {old!r} must be one of its parameters "
            f"({', '.join(arguments)}) and {new!r} a name it does not use yet."
        )
    names = tuple(new if name == old else name for name in code.co_varnames)
    renamed = types.FunctionType(
        code.replace(co_varnames=names),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,  # keeps the __class__ cell, so super() inside still means the defining class
    )
    renamed.__kwdefaults__ = function.__kwdefaults__
    renamed.__annotations__ = {new if name == old else name: kind for name, kind in function.__annotations__.items()}
    renamed.__doc__ = function.__doc__
    renamed.__module__ = function.__module__
    renamed.__qualname__ = function.__qualname__
    return renamed
