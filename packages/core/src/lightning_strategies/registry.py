"""The one registry every plugin writes into: metadata first, classes imported on resolution.

An entry holds everything `list`, `info` and validation need, so none of them imports a
backend or a strategy module. The class behind a name is imported only when it is resolved.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_strategies.errors import CapabilityError, StrategyConflictError, StrategyLookupError
from lightning_strategies.known import (
    LIGHTNING_BUILTIN_NAMES,
    LIGHTNING_FABRIC_NAMES,
    LIGHTNING_TRAINER_NAMES,
    PROJECT_PACKAGES,
    lightning_builtin_entry_points,
    providing_distribution,
)

# The Lightning flavours a name can resolve in. pytorch_lightning and lightning_fabric are the
# standalone distributions of lightning.pytorch and lightning.fabric.
TRAINER_NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
FABRIC_NAMESPACES = ("lightning.fabric", "lightning_fabric")
NAMESPACES = TRAINER_NAMESPACES + FABRIC_NAMESPACES

Target = str | type


def import_target(target: Target) -> Any:
    """Import ``"package.module:Attribute"`` (or return a class as it is)."""
    if not isinstance(target, str):
        return target
    module_name, _, attribute = target.partition(":")
    if not attribute:
        raise ValueError(f"Strategy target {target!r} must be written as 'package.module:ClassName'.")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"Module {module_name!r} has no attribute {attribute!r} (target {target!r}).") from None


def target_text(target: Target) -> str:
    """How a target is shown to users: ``module:Class`` either way."""
    if isinstance(target, str):
        return target
    return f"{target.__module__}:{target.__qualname__}"


@dataclass(frozen=True)
class StrategyEntry:
    """Everything known about one strategy name before its class is imported.

    Attributes:
        name: The string users type, stored in lower case: names are matched case-insensitively.
        target: The ``lightning.pytorch`` strategy class: ``"package.module:ClassName"`` (imported only
            when the name is resolved) or the class itself.
        description: One line shown by ``lightning-strategies list`` and ``info``, and in Lightning's
            own registry.
        init_params: Constructor keyword arguments this name stands for, e.g. ``{"stage": 3}``.
            Arguments a user passes to the class directly take precedence.
        accelerators: Accelerators the strategy supports, e.g. ``("cpu", "cuda")``; Lightning's
            ``"gpu"`` counts as ``"cuda"``. Others are refused with a ``CapabilityError`` before the
            class is imported. None: any.
        precisions: Lightning precision flags the strategy supports, e.g. ``("32-true",
            "bf16-mixed")``. Others are refused with a ``CapabilityError``. None: any.
        optimizers: Optimizer classes the strategy accepts, as ``"package.module:ClassName"``. The
            conformance suite trains with the first one. None: any.
        gradient_accumulation: False if the strategy cannot accumulate gradients
            (``accumulate_grad_batches > 1``).
        pytorch_lightning_target: The class for ``pytorch_lightning.Trainer``. None: derived from
            ``target`` by rewriting its imports (mirror.py).
        fabric_target: The class for ``lightning.Fabric``, as for ``target``. None: the name is not
            offered to Fabric. The ``lightning_fabric`` class is always derived from it.
        replaces_builtin: Must be True to register one of Lightning's built-in names (``deepspeed``,
            ``fsdp``, ``xla``, ...); without it the name is skipped with a reason and Lightning's
            strategy stays in use.
        pip_name: The distribution users install to get this name, where it differs from the one
            registering it.
        parameters: What each constructor parameter means, ``{name: one or two sentences}``, shown by
            ``lightning-strategies info``. It takes precedence over the ``Args:`` section of the class
            docstring, and documents what the docstring cannot, such as a parameter kept from an older
            API and what it maps to now. None: the docstring alone.
        distribution: The installed distribution whose entry point registered the name; None for
            names registered in-process.
        version: That distribution's version.
        plugin: The entry-point name of the plugin, the name ``LIGHTNING_STRATEGIES_DISABLE`` takes.
    """

    name: str
    target: Target
    description: str = ""
    init_params: Mapping[str, Any] = field(default_factory=dict)
    accelerators: tuple[str, ...] | None = None
    precisions: tuple[str, ...] | None = None
    optimizers: tuple[str, ...] | None = None
    gradient_accumulation: bool = True
    pytorch_lightning_target: Target | None = None
    fabric_target: Target | None = None
    replaces_builtin: bool = False
    pip_name: str | None = None
    parameters: Mapping[str, str] | None = None
    distribution: str | None = None
    version: str | None = None
    plugin: str | None = None

    @property
    def provider(self) -> str:
        if self.distribution is None:
            return "registered in this process"
        return f"{self.distribution} {self.version or ''}".strip()

    def target_for(self, namespace: str) -> Target | None:
        """The class (or class path) this name stands for in one Lightning flavour, if any."""
        if namespace == "lightning.pytorch":
            return self.target
        if namespace == "pytorch_lightning":
            return self.pytorch_lightning_target or _mirrored(self.target, namespace)
        if namespace == "lightning.fabric":
            return self.fabric_target
        if namespace == "lightning_fabric":
            return _mirrored(self.fabric_target, namespace) if self.fabric_target else None
        raise ValueError(f"Unknown Lightning namespace {namespace!r}; expected one of {', '.join(NAMESPACES)}.")

    def load_class(self, namespace: str = "lightning.pytorch") -> type:
        """Import the strategy class behind this name (the first heavy step)."""
        target = self.target_for(namespace)
        if target is None:
            raise StrategyLookupError(
                f"Strategy {self.name!r} ({self.provider}) has no {namespace} implementation; "
                f"it supports {', '.join(self.namespaces())}."
            )
        if isinstance(target, str) and target.startswith(_MIRROR_PREFIX):
            from lightning_strategies.mirror import import_mirrored

            return import_mirrored(target)
        return import_target(target)

    def namespaces(self) -> tuple[str, ...]:
        return tuple(ns for ns in NAMESPACES if self.target_for(ns) is not None)

    def check_capabilities(self, accelerator: str | None = None, precision: str | None = None) -> None:
        """Refuse, with the allowed values, an accelerator or precision the metadata rules out.

        Called before the class is imported. Optimizer and gradient-accumulation limits are only
        known once the model and Trainer exist, so strategies enforce those in setup.
        """
        problems = []
        if accelerator and self.accelerators and _accelerator_family(accelerator) not in self.accelerators:
            problems.append(f"accelerator={accelerator!r} is not supported (supported: {', '.join(self.accelerators)})")
        if precision and self.precisions and str(precision) not in self.precisions:
            problems.append(f"precision={precision!r} is not supported (supported: {', '.join(self.precisions)})")
        if problems:
            raise CapabilityError(
                f"Strategy {self.name!r} ({self.provider}): " + "; ".join(problems) + ". "
                f"Run `lightning-strategies info {self.name}` for what it supports."
            )


def _accelerator_family(accelerator: str) -> str:
    """Lightning accepts "gpu" for CUDA (and MPS); capability lists say "cuda"."""
    return "cuda" if accelerator == "gpu" else accelerator


_MIRROR_PREFIX = "lightning_strategies._mirror."


def _mirrored(target: Target | None, namespace: str) -> Target | None:
    """The path of ``target`` rebuilt against a standalone Lightning distribution (see mirror.py)."""
    if target is None:
        return None
    if not isinstance(target, str):
        target = target_text(target)
    return f"{_MIRROR_PREFIX}{namespace}.{target}"


@dataclass(frozen=True)
class PluginProblem:
    """A plugin (or one of its names) that was skipped, with the reason shown by `list`."""

    plugin: str
    distribution: str | None
    reason: str
    names: tuple[str, ...] = ()


# Keywords `register` accepts besides name, target, description and init_params.
_METADATA_FIELDS = frozenset(
    {
        "accelerators",
        "precisions",
        "optimizers",
        "gradient_accumulation",
        "pytorch_lightning_target",
        "fabric_target",
        "replaces_builtin",
        "pip_name",
        "parameters",
    }
)


class StrategyRegistry:
    """Strategy names from every plugin, with the problems met while loading them.

    A name claimed by two distributions is kept out of service (resolving it raises an error
    naming both); every other name keeps working.
    """

    def __init__(self) -> None:
        self._entries: dict[str, StrategyEntry] = {}
        self._clashes: dict[str, list[StrategyEntry]] = {}
        self.problems: list[PluginProblem] = []
        self.loaded_plugins: list[str] = []
        self.disable_problems: list[str] = []  # LIGHTNING_STRATEGIES_DISABLE values that matched no plugin
        self.plugin_manager: Any = None  # the pluggy manager that loaded the plugins, for later hooks

    def __iter__(self) -> Iterator[StrategyEntry]:
        return iter(sorted(self._entries.values(), key=lambda entry: entry.name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def clashes(self) -> dict[str, list[StrategyEntry]]:
        return dict(self._clashes)

    def add(self, entry: StrategyEntry) -> None:
        """Add one entry, applying the clash and built-in policies (design.md, "Rules")."""
        name = entry.name
        if name in self._clashes:
            self._clashes[name].append(entry)
            return
        if name in LIGHTNING_BUILTIN_NAMES and not entry.replaces_builtin:
            self.problems.append(
                PluginProblem(
                    entry.plugin or entry.provider,
                    entry.distribution,
                    f"'{name}' is a Lightning built-in strategy name; the plugin must declare "
                    "replaces_builtin=True to replace it. Lightning's own strategy stays in use.",
                    (name,),
                )
            )
            return
        existing = self._entries.get(name)
        if existing is not None:
            # Even within one distribution (two entry points), a second claim leaves the name unusable.
            del self._entries[name]
            self._clashes[name] = [existing, entry]
            return
        self._entries[name] = entry

    def entry(self, name: str) -> StrategyEntry:
        """The entry for ``name`` (case-insensitive), or an error that says what to do."""
        key = name.lower()
        if key in self._entries:
            return self._entries[key]
        if key in self._clashes:
            raise StrategyConflictError(clash_message(key, self._clashes[key]))
        raise StrategyLookupError(self.unknown_name_message(key))

    def resolve(self, name: str, namespace: str = "lightning.pytorch", **overrides: Any) -> Any:
        """Instantiate the strategy behind ``name`` with its registered defaults and ``overrides``."""
        entry = self.entry(name)
        return entry.load_class(namespace)(**{**entry.init_params, **overrides})

    def unknown_name_message(self, name: str, extra_names: Iterable[str] = (), namespace: str | None = None) -> str:
        """Why ``name`` cannot be used, and what to do instead.

        ``namespace`` is the Lightning flavour that asked (None: any). A name that exists only for
        the other entry point (Trainer or Fabric) says so; otherwise close matches among the names
        that entry point accepts, with the install line for matches from a package of ours that is
        not installed.
        """
        entry_point = _entry_point(namespace)
        distribution = providing_distribution(name)
        entry = self._entries.get(name)
        if entry is None and distribution is not None:
            return (
                f"Strategy {name!r} is provided by the {distribution} package, which is not installed "
                f"(or was disabled). Install it with: pip install {distribution}"
            )
        if entry is not None and namespace is not None and entry.target_for(namespace) is None:
            supported = " and ".join(sorted({_entry_point(ns) or "" for ns in entry.namespaces()}))
            return (
                f"Strategy {name!r} ({entry.provider}) works with {supported} only, not with {entry_point}. "
                f"Use it through {supported}, or pick a name {entry_point} accepts: "
                "`lightning-strategies list` shows which entry point each name works with."
            )
        builtin_in = lightning_builtin_entry_points(name)
        if entry is None and builtin_in and entry_point is not None and entry_point not in builtin_in:
            return (
                f"{name!r} is a Lightning built-in strategy of {' and '.join(builtin_in)} only; "
                f"{entry_point} does not have it." + self._close_matches(name, extra_names, namespace)
            )
        return f"Unknown strategy name {name!r}." + self._close_matches(name, extra_names, namespace)

    def _close_matches(self, name: str, extra_names: Iterable[str], namespace: str | None) -> str:
        ours = {entry.name for entry in self if namespace is None or entry.target_for(namespace) is not None}
        entry_point = _entry_point(namespace)
        builtins = {"Trainer": LIGHTNING_TRAINER_NAMES, "Fabric": LIGHTNING_FABRIC_NAMES}.get(
            entry_point or "", LIGHTNING_BUILTIN_NAMES
        )
        candidates = sorted({*ours, *builtins, *extra_names, *_known_names()} - {name})
        matches = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
        message = ""
        if matches:
            message += " Did you mean: " + ", ".join(repr(match) for match in matches) + "?"
            # Only the closest matches earn an install line: "fsdpp" is "fsdp", not "xla_fsdp".
            best = max(_similarity(name, match) for match in matches)
            hints = {
                distribution
                for match in matches
                if _similarity(name, match) == best
                and match not in self._entries
                and (distribution := providing_distribution(match))
            }
            for hint in sorted(hints):
                message += f" ({hint} is not installed: pip install {hint})"
        return message + " Run `lightning-strategies list` to see every available name."


def _similarity(name: str, candidate: str) -> float:
    return difflib.SequenceMatcher(None, name, candidate).ratio()


def _entry_point(namespace: str | None) -> str | None:
    """How users know a Lightning flavour: "Trainer" or "Fabric" (None: either)."""
    if namespace is None:
        return None
    return "Trainer" if namespace in TRAINER_NAMESPACES else "Fabric"


def _known_names() -> set[str]:
    return {name for names in PROJECT_PACKAGES.values() for name in names}


def clash_message(name: str, entries: list[StrategyEntry]) -> str:
    providers = " and ".join(entry.provider for entry in entries)
    return (
        f"Strategy name {name!r} is claimed by more than one installed distribution: {providers}. "
        "Uninstall one of them, or skip one with LIGHTNING_STRATEGIES_DISABLE=<entry point name>."
    )


class PluginRegistrar:
    """What a plugin's ``register_strategies(registry)`` hook receives.

    Entries are collected and handed to the registry only once the hook returns, so a plugin
    whose hook fails half-way leaves no names behind.
    """

    def __init__(self, plugin: str, distribution: str | None = None, version: str | None = None) -> None:
        self.plugin = plugin
        self.distribution = distribution
        self.version = version
        self.entries: list[StrategyEntry] = []

    def register(
        self,
        name: str,
        target: Target,
        description: str = "",
        init_params: Mapping[str, Any] | None = None,
        **metadata: Any,
    ) -> None:
        """Register ``name`` for ``target`` ("module:Class" or a class); see StrategyEntry for metadata."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"A strategy name must be a non-empty string, got {name!r}.")
        unknown = set(metadata) - _METADATA_FIELDS
        if unknown:
            raise TypeError(
                f"register({name!r}) got unknown metadata {sorted(unknown)}; "
                f"accepted: {', '.join(sorted(_METADATA_FIELDS))}."
            )
        if isinstance(target, str) and ":" not in target:
            raise ValueError(f"register({name!r}): target {target!r} must be written as 'package.module:ClassName'.")
        if any(entry.name == name.lower() for entry in self.entries):
            raise ValueError(f"register({name!r}) was called twice by the same plugin.")
        for key in ("accelerators", "precisions", "optimizers"):
            if metadata.get(key) is not None:
                metadata[key] = tuple(metadata[key])
        parameters = metadata.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, Mapping) or not all(
                isinstance(key, str) and isinstance(value, str) for key, value in parameters.items()
            ):
                raise TypeError(f"register({name!r}): parameters must map parameter names to their meaning (str).")
            metadata["parameters"] = dict(parameters)
        for optimizer in metadata.get("optimizers") or ():
            if ":" not in optimizer:
                raise ValueError(
                    f"register({name!r}): optimizer {optimizer!r} must be written as 'package.module:ClassName'."
                )
        self.entries.append(
            StrategyEntry(
                name=name.lower(),
                target=target,
                description=description,
                init_params=dict(init_params or {}),
                distribution=self.distribution,
                version=self.version,
                plugin=self.plugin,
                **metadata,
            )
        )


_registry: StrategyRegistry | None = None
_registry_lock = threading.Lock()


def get_registry() -> StrategyRegistry:
    """The process-wide registry, filled from installed plugins on first use."""
    global _registry
    if _registry is None:
        with _registry_lock:
            if _registry is None:
                from lightning_strategies.plugins import load_installed_plugins

                registry = StrategyRegistry()
                load_installed_plugins(registry)
                _registry = registry
    return _registry
