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
    unknown keyword. ``constructor_for`` does the same and names the copy after the face, as users' errors should.
    """
    return _copy(
        function, function.__qualname__, {old: new}, f"rename_parameter({function.__qualname__}, {old!r}, {new!r})"
    )


def constructor_for(face: str, constructor: Callable[..., Any], /, **renamed: str) -> Callable[..., Any]:
    """A copy of ``constructor`` (written once in a body) that is the constructor of the class named ``face``.

    Written in the face's class body as ``__init__ = constructor_for(__qualname__, Body.__init__)``, adding
    ``precision="precision_plugin"`` on a Trainer face whose Lightning base names that parameter so. Python words a
    wrong call (an unknown or repeated keyword, a missing argument) after the code's qualified name, so the copy is
    the face's: ``DeepSpeedStrategy.__init__() got an unexpected keyword argument 'stag'`` names the class the user
    called, not a body they never see. Everything else is the body's: defaults, annotations, docstring and the
    ``__class__`` cell, so ``super()`` inside still means the body's next class.
    """
    renames = ", ".join(f"{old}={new!r}" for old, new in renamed.items())
    caller = f"constructor_for({face!r}, {constructor.__qualname__}{', ' if renames else ''}{renames})"
    return _copy(constructor, f"{face}.{constructor.__name__}", renamed, caller)


def _copy(function: Callable[..., Any], qualname: str, renamed: dict[str, str], caller: str) -> Callable[..., Any]:
    """``function``'s code, defaults and closure under ``qualname``, each parameter ``old`` in ``renamed`` called
    ``new``; ``caller`` is the call named in the error when a name cannot be changed."""
    code = function.__code__
    arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    for old, new in renamed.items():
        if old not in arguments or new in code.co_varnames or list(renamed.values()).count(new) > 1:
            raise ValueError(
                f"{caller}: {old!r} must be one of its parameters ({', '.join(arguments)}) and {new!r} a name it "
                "does not use yet, given once."
            )
    # A wrong call is worded after the code's qualified name, so the copy's names the face.
    code = code.replace(co_varnames=tuple(renamed.get(name, name) for name in code.co_varnames), co_qualname=qualname)
    copy = types.FunctionType(
        code,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,  # keeps the __class__ cell, so super() inside still means the defining class
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__annotations__ = {renamed.get(name, name): kind for name, kind in function.__annotations__.items()}
    copy.__doc__ = function.__doc__
    copy.__module__ = function.__module__
    copy.__qualname__ = qualname
    return copy
