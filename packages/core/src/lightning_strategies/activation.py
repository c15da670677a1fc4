"""Making registered names work in Lightning without an import of ours.

Lightning reads its strategy registries when a Trainer or Fabric is built, and never loads
entry points. When one of its registries is imported, we add a lazy factory for every name of
ours (the class is imported only when the name is resolved), and placeholders that explain
names of our packages that are not installed. When a connector is imported, we wrap two of its
steps so an unknown name gets close matches, and capability metadata is checked before the
strategy class is imported.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import _lightning_strategies_autoload

from lightning_strategies.entries import TRAINER_NAMESPACES
from lightning_strategies.errors import StrategyConflictError, StrategyLookupError
from lightning_strategies.hooks import plugins_of
from lightning_strategies.known import (
    LIGHTNING_BUILTIN_ACCELERATORS,
    LIGHTNING_BUILTIN_NAMES,
    PROJECT_PACKAGES,
    providing_distribution,
)
from lightning_strategies.registry import StrategyRegistry, clash_message, get_registry

log = logging.getLogger(__name__)

# Lightning refuses some built-in names on CPU by name, before any strategy exists. A plugin that
# replaces the name replaces the strategy, so the name is taken off these lists.
# (kind of watched module, whether it is the Trainer's) -> (class holding the list, or None: the module; the list)
_BUILTIN_NAME_GUARDS = {
    ("strategy registry", True): ("FSDPStrategy", "_registered_strategies"),
    ("connector", False): (None, "_FSDP_ALIASES"),
}


def watched_modules(kind: str | None = None) -> tuple[str, ...]:
    """The Lightning modules core watches (``lightning_module_imported`` is called for each), of one ``kind``
    where given: "strategy registry", "connector" or "xla accelerator"."""
    table = _lightning_strategies_autoload.WATCHED_MODULES
    return tuple(module for module, (_, what, _) in table.items() if kind is None or what == kind)


def activate() -> None:
    """Make every registered name resolvable in Lightning, also where start-up hooks are off.

    Registries already imported are filled now; the others when they are imported.
    """
    _lightning_strategies_autoload.install()
    for module_name in watched_modules():
        module = sys.modules.get(module_name)
        if module is not None:
            on_lightning_import(module_name, module)


def on_lightning_import(module_name: str, module: ModuleType) -> None:
    """Called right after Lightning executed one of the watched modules."""
    try:
        if module_name in _lightning_strategies_autoload.WATCHED_MODULES:
            namespace, kind, attribute = _lightning_strategies_autoload.WATCHED_MODULES[module_name]
            if kind == "strategy registry":
                fill_lightning_registry(getattr(module, attribute), namespace)
            if kind == "connector":
                _patch_connector(getattr(module, attribute), namespace)
            guard = _BUILTIN_NAME_GUARDS.get((kind, namespace in TRAINER_NAMESPACES))
            if guard is not None:
                _lift_builtin_name_guard(module, *guard)
        plugins_of(get_registry()).lightning_module_imported(module_name, module)
    except Exception as error:  # activation must never break `import lightning`
        _warn_activation_failed(module_name, error)


class ActivationWarning(UserWarning):
    """Activation could not adjust one of Lightning's modules: most likely a Lightning internal changed."""


def _warn_activation_failed(module_name: str, error: Exception) -> None:
    """Say, where the user sees it, what activation met and what no longer works; never raise.

    A log line alone went unseen when a Lightning upgrade renamed an internal activation replaces
    (docs/internals.md lists them), and the user only met Lightning's "invalid strategy name" later.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        lightning = version("lightning")
    except PackageNotFoundError:
        lightning = "not installed as `lightning`"
    message = (
        f"lightning-strategies could not adjust {module_name} (Lightning {lightning}): {type(error).__name__}: "
        f"{error}. Strategy names of lightning-strategies packages may not resolve in Trainer/Fabric(strategy=...), "
        "and unknown names get Lightning's own message. Import the strategy class instead, or use a Lightning "
        "version this release was tested with (docs/internals.md), and report the version."
    )
    log.debug("activation of %s failed", module_name, exc_info=error)
    try:
        warnings.warn(message, ActivationWarning, stacklevel=2)
    except Warning:  # warnings turned into errors: Lightning's import still goes on
        log.error(message)


class LazyStrategy:
    """What Lightning's registry calls for one of our names: imports the class, then builds it."""

    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace

    def __call__(self, **init_params: Any) -> Any:
        try:
            entry = get_registry().entry(self.name)
        except StrategyLookupError as error:  # the name's plugin is gone since: Lightning would call it invalid
            raise StrategyLookupError(f"{invalid_name_sentence(self.name)} {error}") from None
        return entry.load_class(self.namespace)(**init_params)

    def __repr__(self) -> str:
        return f"LazyStrategy({self.name!r}, {self.namespace!r})"


class _Unavailable:
    """A placeholder for a name Lightning should know but cannot use: it raises the reason."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __call__(self, **_: Any) -> Any:
        raise self.error


def fill_lightning_registry(lightning_registry: Any, namespace: str, registry: StrategyRegistry | None = None) -> None:
    registry = registry or get_registry()
    for entry in registry:
        if entry.target_for(namespace) is None:
            continue
        lightning_registry.register(
            entry.name, LazyStrategy(entry.name, namespace), description=entry.description, override=True
        )
        # Set directly: Lightning passes init_params on as keywords, and ours may include names
        # (like "description") that register() itself takes.
        lightning_registry[entry.name]["init_params"] = dict(entry.init_params)
    for name, entries in registry.clashes().items():
        lightning_registry.register(
            name,
            _Unavailable(StrategyConflictError(clash_message(name, entries))),
            description="unavailable: claimed twice",
            override=True,
        )
    for names in PROJECT_PACKAGES.values():
        for name in names:
            if name in registry or name in LIGHTNING_BUILTIN_NAMES or name in lightning_registry:
                continue
            # Lightning would call the name invalid: its words first, then what to install.
            missing = StrategyLookupError(f"{invalid_name_sentence(name)} {registry.unknown_name_message(name)}")
            lightning_registry.register(name, _Unavailable(missing), description="not installed")


def _lift_builtin_name_guard(module: ModuleType, class_name: str | None, attribute: str) -> None:
    owner = getattr(module, class_name) if class_name else module
    guarded = getattr(owner, attribute, None)
    if guarded is None:
        return
    replaced = {entry.name for entry in get_registry() if entry.replaces_builtin}
    kept = [name for name in guarded if name not in replaced]
    setattr(owner, attribute, type(guarded)(kept))


def _accelerator_name(accelerator: Any) -> str | None:
    if isinstance(accelerator, str):
        return None if accelerator == "auto" else accelerator
    name = type(accelerator).__name__.lower().removesuffix("accelerator")
    return {"xla": "tpu"}.get(name, name)


def _patch_connector(connector: Any, namespace: str) -> None:
    """Wrap the connector steps that validate the strategy flag and build the strategy."""
    if getattr(connector, "_lightning_strategies_patched", False):
        return
    check_flags = connector._check_config_and_set_final_flags
    init_accelerator = connector._set_parallel_devices_and_init_accelerator
    check_fallback = connector._check_strategy_and_fallback
    init_strategy = connector._init_strategy

    @functools.wraps(check_flags)
    def check_config_and_set_final_flags(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return check_flags(self, *args, **kwargs)
        except ValueError as error:
            strategy = kwargs.get("strategy", args[0] if args else None)
            if isinstance(strategy, str) and "invalid strategy name" in str(error):
                lightning_names = getattr(self, "_registered_strategies", ())
                name = strategy.lower()
                message = get_registry().unknown_name_message(name, lightning_names, namespace)
                # Lightning's first sentence stays, so that a match= written against it passes; its list of choices
                # gives way to ours, which has our names and the install line.
                lightnings = re.split(r"(?<=\.)\s+", str(error), maxsplit=1)[0]
                message = message.removeprefix(f"Unknown strategy name {name!r}.").lstrip()
                raise StrategyLookupError(f"{lightnings} {message}") from None
            raise

    @functools.wraps(init_accelerator)
    def set_parallel_devices_and_init_accelerator(self: Any) -> Any:
        try:
            return init_accelerator(self)
        except ImportError as error:  # Lightning's TPU accelerator asks for torch_xla, and not for our package
            if isinstance(self._strategy_flag, str) and _builtin_stands_in(self._strategy_flag):
                raise StrategyLookupError(_stand_in_message(self._strategy_flag, f"failed: {error}")) from None
            raise

    @functools.wraps(check_fallback)
    def check_strategy_and_fallback(self: Any) -> Any:
        _refuse_builtin_stand_in(self._strategy_flag, _accelerator_name(self._accelerator_flag))
        return check_fallback(self)

    @functools.wraps(init_strategy)
    def init_strategy_checked(self: Any) -> Any:
        name = self._strategy_flag
        if isinstance(name, str) and name in get_registry():
            # The Trainer's connector calls the flag _precision_flag, Fabric's _precision_input.
            precision = getattr(self, "_precision_flag", getattr(self, "_precision_input", None))
            get_registry().entry(name).check_capabilities(
                accelerator=_accelerator_name(self._accelerator_flag), precision=precision
            )
        if isinstance(name, str) and _builtin_stands_in(name):
            try:
                return init_strategy(self)
            except Exception as error:
                raise StrategyLookupError(_stand_in_message(name, f"failed: {error}")) from None
        result = init_strategy(self)
        if namespace in TRAINER_NAMESPACES:
            _check_checkpoints_before_loading(getattr(self, "strategy", None), namespace)
        return result

    connector._check_config_and_set_final_flags = check_config_and_set_final_flags
    connector._set_parallel_devices_and_init_accelerator = set_parallel_devices_and_init_accelerator
    connector._check_strategy_and_fallback = check_strategy_and_fallback
    connector._init_strategy = init_strategy_checked
    connector._lightning_strategies_patched = True


def _check_checkpoints_before_loading(strategy: Any, namespace: str) -> None:
    """Give a Trainer strategy that reads checkpoints with Lightning's own ``Strategy.load_checkpoint`` (ddp and the
    other built-ins) core's check of folders: an FSDP2 DCP folder is converted to one file inside it and resumed
    (``one_file_for``), another strategy's folder (DeepSpeed's) is refused with what it is and the command that
    converts it, instead of ``IsADirectoryError``. A file is left to Lightning as before."""
    base = getattr(sys.modules.get(f"{namespace}.strategies.strategy"), "Strategy", None)
    if strategy is None or base is None or type(strategy).load_checkpoint is not base.load_checkpoint:
        return  # a strategy that reads its own formats checks them itself
    strategy.load_checkpoint = _FolderCheckedLoad(strategy)


class _FolderCheckedLoad:
    """``load_checkpoint`` of one strategy, checking folders first; a picklable object rather than a closure, since
    ddp_spawn pickles the Trainer and its strategy into the processes it starts."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def __call__(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        from lightning_strategies.checkpoints import (
            check_checkpoint_file,
            is_local,
            one_file_for,
            reads_torch_save_files,
        )

        strategy = self.strategy
        if reads_torch_save_files(strategy.checkpoint_io):
            checkpoint_path = one_file_for(checkpoint_path, strategy, kwargs.get("weights_only"))
            if is_local(checkpoint_path) and Path(checkpoint_path).is_dir():
                check_checkpoint_file(checkpoint_path, strategy.checkpoint_io, type(strategy).__name__)
        return type(strategy).load_checkpoint(strategy, checkpoint_path, *args, **kwargs)


def invalid_name_sentence(name: str) -> str:
    """Lightning's first sentence for a strategy name its registry lacks; ours begin with it."""
    return f"You selected an invalid strategy name: `strategy={name!r}`."


def _builtin_stands_in(name: str) -> bool:
    """Whether Lightning's own strategy answers a name that a package of ours, not installed, provides."""
    name = name.lower()
    return name in LIGHTNING_BUILTIN_NAMES and name not in get_registry() and providing_distribution(name) is not None


def _refuse_builtin_stand_in(name: Any, accelerator: str | None) -> None:
    """Refuse, before Lightning builds it, a stand-in built-in on an accelerator it cannot run on.

    Lightning's own strategy would fail only later (at fit, or asking for a backend that does not
    help on this accelerator); the package of ours that provides the name is what the user needs.
    """
    if not isinstance(name, str) or not _builtin_stands_in(name) or accelerator is None:
        return
    runs_on = LIGHTNING_BUILTIN_ACCELERATORS.get(name.lower())
    if runs_on and _accelerator_family(accelerator) not in runs_on:
        raise StrategyLookupError(
            _stand_in_message(name, f"runs only on {', '.join(runs_on)}, not on accelerator={accelerator!r}")
        )


def _accelerator_family(accelerator: str) -> str:
    return {"gpu": "cuda", "xla": "tpu"}.get(accelerator, accelerator)


def _stand_in_message(name: str, problem: str) -> str:
    name = name.lower()
    distribution = providing_distribution(name)
    return (
        f"Strategy {name!r} is provided by the {distribution} package, which is not installed (or was "
        f"disabled), so Lightning's own {name!r} strategy answered, and it {problem.rstrip('.')}. "
        f"Rather than Lightning's advice, install {distribution}, which provides {name!r}: pip install {distribution}"
    )
