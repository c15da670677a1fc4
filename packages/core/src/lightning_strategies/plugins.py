"""Discovery: load every installed distribution's ``lightning_strategies`` entry point.

A plugin that cannot be imported, or whose hook raises, is recorded with its reason and skipped;
every other plugin keeps working. Only installed distributions' entry points are loaded.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy

from lightning_strategies import hookspecs
from lightning_strategies.registry import PluginProblem, PluginRegistrar, StrategyRegistry

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "lightning_strategies"
DISABLE_VARIABLE = "LIGHTNING_STRATEGIES_DISABLE"


def disabled_entry_points() -> set[str]:
    """Entry-point names listed in LIGHTNING_STRATEGIES_DISABLE ("*" disables all)."""
    value = os.environ.get(DISABLE_VARIABLE, "")
    return {item.strip() for item in value.split(",") if item.strip()}


def new_plugin_manager() -> pluggy.PluginManager:
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    return manager


def load_installed_plugins(registry: StrategyRegistry) -> None:
    disabled = disabled_entry_points()
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        if "*" in disabled or entry_point.name in disabled:
            log.debug("plugin %s skipped: listed in %s", entry_point.name, DISABLE_VARIABLE)
            continue
        distribution, version = _distribution_of(entry_point)
        try:
            plugin = entry_point.load()
        except Exception as error:  # a broken plugin must not take the others down
            _record_failure(registry, entry_point.name, distribution, f"import failed: {error!r}")
            continue
        register_plugin(registry, plugin, entry_point.name, distribution, version)


def register_plugin(
    registry: StrategyRegistry,
    plugin: Any,
    name: str,
    distribution: str | None = None,
    version: str | None = None,
) -> None:
    """Validate ``plugin``'s hooks against the specs and add the names it registers."""
    manager = registry.plugin_manager = registry.plugin_manager or new_plugin_manager()
    try:
        manager.register(plugin, name=name)
        manager.check_pending()
    except Exception as error:
        if manager.get_plugin(name) is not None:
            manager.unregister(name=name)
        _record_failure(registry, name, distribution, f"invalid plugin: {error}")
        return
    registrar = PluginRegistrar(name, distribution, version)
    for implementation in manager.hook.register_strategies.get_hookimpls():
        if implementation.plugin_name != name:
            continue
        available = {"registry": registrar}
        try:
            implementation.function(**{arg: available[arg] for arg in implementation.argnames})
        except Exception as error:
            _record_failure(registry, name, distribution, f"register_strategies failed: {error!r}")
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
