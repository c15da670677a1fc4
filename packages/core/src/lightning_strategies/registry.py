"""The names every plugin registered, and the process-wide registry filled from installed plugins on first use.

The registry holds names only: one entry per name (``entries.StrategyEntry``), the clashes, and what
was skipped while loading. Which plugins filled it, and calling their other hooks, is ``hooks``' part.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from lightning_strategies.entries import TRAINER_NAMESPACES, StrategyEntry
from lightning_strategies.errors import StrategyConflictError, StrategyLookupError
from lightning_strategies.known import (
    LIGHTNING_BUILTIN_NAMES,
    LIGHTNING_FABRIC_NAMES,
    LIGHTNING_TRAINER_NAMES,
    PROJECT_PACKAGES,
    lightning_builtin_entry_points,
    providing_distribution,
)
from lightning_strategies.plugins import PluginProblem, load_installed_plugins


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


_registry: StrategyRegistry | None = None
_registry_lock = threading.Lock()


def get_registry() -> StrategyRegistry:
    """The process-wide registry, filled from installed plugins on first use."""
    global _registry
    if _registry is None:
        with _registry_lock:
            if _registry is None:
                registry = StrategyRegistry()
                load_installed_plugins(registry)
                _registry = registry
    return _registry
