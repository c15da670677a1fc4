"""Discovery: load every installed distribution's ``lightning_strategies`` entry point into a registry.

A plugin that cannot be imported, whose hooks do not match the specs, or whose ``register_strategies``
raises is recorded with its reason (shown by `list` and `doctor`) and registers no names; every other
plugin keeps working. Only installed distributions' entry points are loaded.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from lightning_strategies.entries import PluginRegistrar
from lightning_strategies.hooks import plugins_of

if TYPE_CHECKING:
    from lightning_strategies.registry import StrategyRegistry

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "lightning_strategies"
DISABLE_VARIABLE = "LIGHTNING_STRATEGIES_DISABLE"


def disabled_entry_points() -> set[str]:
    """Values listed in LIGHTNING_STRATEGIES_DISABLE ("*" disables all), split on commas or spaces."""
    value = os.environ.get(DISABLE_VARIABLE, "")
    return {item for item in re.split(r"[,\s]+", value) if item}


def _normalized(distribution: str) -> str:
    """Distribution names compare as pip compares them: case, '_' and '.' do not matter."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


@dataclass(frozen=True)
class PluginProblem:
    """A plugin (or one of its names) that was skipped, with the reason shown by `list`."""

    plugin: str
    distribution: str | None
    reason: str
    names: tuple[str, ...] = ()


def load_installed_plugins(registry: StrategyRegistry) -> None:
    disabled = disabled_entry_points()
    used: set[str] = set()
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    for entry_point in found:
        distribution, version = _distribution_of(entry_point)
        # An entry point is disabled by its own name or by its distribution's (what users pip install).
        matches = {value for value in disabled if value in ("*", entry_point.name)}
        matches |= {value for value in disabled if distribution and _normalized(value) == _normalized(distribution)}
        if matches:
            used |= matches
            log.debug("plugin %s skipped: listed in %s", entry_point.name, DISABLE_VARIABLE)
            continue
        try:
            plugin = entry_point.load()
        except Exception as error:  # a broken plugin must not take the others down
            _record_failure(registry, entry_point.name, distribution, f"import failed: {error!r}")
            continue
        register_plugin(registry, plugin, entry_point.name, distribution, version)
    for value in sorted(disabled - used - {"*"}):
        message = _unmatched_disable_message(value, registry, found)
        log.warning("lightning-strategies: %s", message)
        registry.disable_problems.append(message)


def _unmatched_disable_message(value: str, registry: StrategyRegistry, found: list[EntryPoint]) -> str:
    """Why a LIGHTNING_STRATEGIES_DISABLE value disabled nothing, and what to write instead."""
    names = sorted({ep.name for ep in found})
    distributions = sorted({dist for ep in found if (dist := _distribution_of(ep)[0])})
    message = f"{DISABLE_VARIABLE}={value!r} matches no installed plugin, so it disabled nothing."
    if value.lower() in registry:
        plugin = registry.entry(value).plugin
        message += f" {value!r} is a strategy name; its plugin is {plugin!r}: {DISABLE_VARIABLE}={plugin}."
    else:
        close = difflib.get_close_matches(value, names + distributions, n=1, cutoff=0.6)
        if close:
            message += f" Did you mean {close[0]!r}?"
    listed = ", ".join(names + distributions) or "none installed"
    return message + f" It takes entry-point or distribution names, separated by commas ({listed})."


def register_plugin(
    registry: StrategyRegistry,
    plugin: Any,
    name: str,
    distribution: str | None = None,
    version: str | None = None,
) -> None:
    """Validate ``plugin``'s hooks against the specs and add the names it registers."""
    plugins = plugins_of(registry)
    try:
        plugins.add(plugin, name, distribution)
    except Exception as error:
        _record_failure(registry, name, distribution, f"invalid plugin: {error}")
        return
    registrar = PluginRegistrar(name, distribution, version)
    asked = plugins.register_strategies(name, registrar)
    if asked.failures:  # logged already, where the hook was called
        registry.problems.append(PluginProblem(name, distribution, asked.failures[0].reason))
        return
    for entry in registrar.entries:
        registry.add(entry)
    registry.loaded_plugins.append(name)


def _distribution_of(entry_point: EntryPoint) -> tuple[str | None, str | None]:
    dist = entry_point.dist
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


def _record_failure(registry: StrategyRegistry, plugin: str, distribution: str | None, reason: str) -> None:
    log.warning("lightning-strategies: plugin %r (%s) skipped: %s", plugin, distribution or "unknown", reason)
    registry.problems.append(PluginProblem(plugin, distribution, reason))
