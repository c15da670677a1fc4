"""What one strategy name stands for, and how a plugin declares it: metadata first, class imported on resolution.

An entry holds everything `list`, `info` and validation need, so none of them imports a backend or a
strategy module. ``PluginRegistrar`` is what a plugin's ``register_strategies`` hook fills with entries;
``registry.StrategyRegistry`` is where they are kept.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_strategies import mirror
from lightning_strategies.errors import CapabilityError, StrategyLookupError

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
        if isinstance(target, str) and target.startswith(mirror.PREFIX):
            mirror.install()  # the standalone flavours' classes are built from this source on import
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


def _mirrored(target: Target | None, namespace: str) -> Target | None:
    """The path of ``target`` rebuilt against a standalone Lightning distribution (see mirror.py)."""
    if target is None:
        return None
    if not isinstance(target, str):
        target = target_text(target)
    return f"{mirror.PREFIX}.{namespace}.{target}"


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
