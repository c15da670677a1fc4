"""The one path through which core calls plugins' hooks, with one rule for a plugin whose hook fails.

pluggy ends a hook call at the first implementation that raises, so one broken plugin would hide every
other plugin's answer, and end `lightning-strategies doctor` in a traceback. Here each plugin's
implementation is called on its own, in pluggy's order (the plugin registered last first, ``tryfirst`` and
``trylast`` respected). One that raises, or answers with something its hook does not return, is skipped
for that call: it is logged once and handed back as a ``HookFailure``, for the command to print, and every
other plugin's answer is used.

The plugins belong to the registry they filled (``plugins_of``) but are kept here: the registry holds
names only. A new registry has no plugins, which is how tests swap in an empty one.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pluggy

from lightning_strategies import hookspecs

if TYPE_CHECKING:
    from lightning_strategies.checkpoints.formats import CheckpointFormat
    from lightning_strategies.entries import PluginRegistrar
    from lightning_strategies.planning import Candidate, Machine, Workload
    from lightning_strategies.registry import StrategyRegistry

log = logging.getLogger(__name__)

Answer = TypeVar("Answer")


@dataclass(frozen=True)
class HookFailure:
    """One plugin's hook that raised, or answered with the wrong type, in one call; that plugin was skipped."""

    plugin: str  # the entry-point name, which LIGHTNING_STRATEGIES_DISABLE takes
    distribution: str | None
    hook: str
    error: Exception

    @property
    def reason(self) -> str:
        return f"{self.hook} failed: {self.error!r}"

    @property
    def what_to_do(self) -> str:
        authors = f"{self.distribution}'s authors" if self.distribution else "the plugin's authors"
        return f"report it to {authors}; LIGHTNING_STRATEGIES_DISABLE={self.plugin} turns the plugin off"

    def __str__(self) -> str:
        distribution = self.distribution or "unknown distribution"
        return f"plugin {self.plugin!r} ({distribution}): {self.reason}; skipped ({self.what_to_do})."


@dataclass
class HookAnswers(Generic[Answer]):
    """One hook call's outcome: each answering plugin's answer in call order, and the plugins skipped."""

    answers: list[Answer] = field(default_factory=list)
    failures: list[HookFailure] = field(default_factory=list)


class LoadedPlugins:
    """The plugins loaded into one registry, and the hook calls core makes to them: one method per hook of
    ``hookspecs``, taking the spec's arguments and answering with its return type."""

    def __init__(self) -> None:
        self._manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._manager.add_hookspecs(hookspecs)
        self._distributions: dict[str, str | None] = {}
        self._logged: set[tuple[str, str, str]] = set()

    def add(self, plugin: object, name: str, distribution: str | None) -> None:
        """Register ``plugin`` as ``name``; raise, leaving nothing of it registered, where its hooks do not match
        the specs."""
        if self._manager.has_plugin(name):
            raise ValueError(f"a plugin named {name!r} is registered already")
        try:
            self._manager.register(plugin, name=name)
            self._manager.check_pending()
            _refuse_wrappers(self._manager, plugin)
        except Exception:
            if self._manager.get_plugin(name) is plugin:
                self._manager.unregister(name=name)
            raise
        self._distributions[name] = distribution

    def remove(self, name: str) -> None:
        """Stop calling ``name``'s hooks (the names it registered stay in the registry)."""
        self._manager.unregister(name=name)
        self._distributions.pop(name, None)

    def register_strategies(self, plugin: str, registry: PluginRegistrar) -> HookAnswers[None]:
        """``plugin``'s hook alone: each plugin registers its names once, as it is loaded."""
        return self._call("register_strategies", {"registry": registry}, _ignored, only=plugin)

    def environment_checks(self) -> HookAnswers[list[tuple[str, bool, str]]]:
        return self._call("environment_checks", {}, _checks)

    def checkpoint_formats(self) -> HookAnswers[list[CheckpointFormat]]:
        return self._call("checkpoint_formats", {}, _list_of("CheckpointFormat", "key", "matches"))

    def lightning_module_imported(self, module_name: str, module: ModuleType) -> HookAnswers[None]:
        return self._call("lightning_module_imported", {"module_name": module_name, "module": module}, _ignored)

    def memory_plan_candidates(self, workload: Workload, machine: Machine) -> HookAnswers[list[Candidate]]:
        arguments = {"workload": workload, "machine": machine}
        return self._call("memory_plan_candidates", arguments, _list_of("Candidate", "strategy", "fits"))

    def _call(
        self,
        hook: str,
        arguments: dict[str, object],
        accept: Callable[[Any], Answer],
        only: str | None = None,
    ) -> HookAnswers[Answer]:
        outcome: HookAnswers[Answer] = HookAnswers()
        for implementation in reversed(getattr(self._manager.hook, hook).get_hookimpls()):
            if only is not None and implementation.plugin_name != only:
                continue
            try:
                # As pluggy passes them: only the arguments the implementation names, since a spec may grow.
                positional = [arguments[name] for name in implementation.argnames]
                keywords = {name: arguments[name] for name in implementation.kwargnames if name in arguments}
                answer = implementation.function(*positional, **keywords)
                outcome.answers.append(accept(answer))
            except Exception as error:  # one plugin's bug must not hide the other plugins' answers
                failure = HookFailure(
                    implementation.plugin_name, self._distributions.get(implementation.plugin_name), hook, error
                )
                self._log_once(failure)
                outcome.failures.append(failure)
        return outcome

    def _log_once(self, failure: HookFailure) -> None:
        """`plan` asks its hook once per machine it tries: one warning per distinct failure is enough."""
        key = (failure.plugin, failure.hook, repr(failure.error))
        if key not in self._logged:
            self._logged.add(key)
            log.warning("lightning-strategies: %s", failure)


def _refuse_wrappers(manager: pluggy.PluginManager, plugin: object) -> None:
    """Each implementation is called on its own, so a wrapper would have nothing to wrap."""
    for caller in manager.get_hookcallers(plugin) or ():
        for implementation in caller.get_hookimpls():
            if implementation.plugin is plugin and (implementation.wrapper or implementation.hookwrapper):
                raise ValueError(
                    f"its {caller.name} hook is a wrapper; core calls each plugin's hook on its own, so drop "
                    "wrapper=True / hookwrapper=True and return the hook's answer"
                )


def _ignored(answer: object) -> None:
    """For hooks that act rather than answer."""


def _checks(answer: Any) -> list[tuple[str, bool, str]]:
    checks = []
    for check in answer or ():
        if not isinstance(check, tuple | list) or len(check) != 3:
            raise TypeError(f"answered {check!r}; each check is a (what, ok, detail) tuple")
        what, ok, detail = check
        checks.append((str(what), bool(ok), str(detail)))
    return checks


def _list_of(kind: str, *attributes: str) -> Callable[[Any], list[Any]]:
    """A list of ``kind`` objects, told by their attributes: checking the class itself would import the module
    that defines it, and those modules call their hooks through this one."""

    def accept(answer: Any) -> list[Any]:
        items = list(answer or ())
        for item in items:
            if not all(hasattr(item, attribute) for attribute in attributes):
                raise TypeError(f"answered {item!r}, which is not a {kind}")
        return items

    return accept


_plugins: weakref.WeakKeyDictionary[StrategyRegistry, LoadedPlugins] = weakref.WeakKeyDictionary()
_plugins_lock = threading.Lock()


def plugins_of(registry: StrategyRegistry) -> LoadedPlugins:
    """The plugins loaded into ``registry``: none yet for a new one."""
    with _plugins_lock:
        plugins = _plugins.get(registry)
        if plugins is None:
            plugins = _plugins[registry] = LoadedPlugins()
        return plugins
