"""Start-up hook of lightning-strategies, run by ``lightning_strategies_autoload.pth``.

It must cost next to nothing in every Python process, so it imports only ``sys`` and ``os`` and
does one thing: when Lightning's strategy registries (or connectors, or XLA accelerator) are
imported, it hands them to ``lightning_strategies.activation``, which fills them with lazy
entries and lets plugins adjust them. Nothing else of ours is imported until then. It also
answers, last of all finders, for the modules of retired integrations our packages replace, so
that an old import fails with the import to use.
``LIGHTNING_STRATEGIES_AUTOLOAD=0`` turns it off.

PYTEST_DONT_REWRITE: it runs before pytest starts, so pytest must not try to rewrite it.
"""

import os
import sys

# The one table of the Lightning modules core watches: module -> (the namespace it belongs to, what it holds,
# the attribute holding it). activation.py acts on it by kind; plugins find modules by kind through
# ``lightning_strategies.watched_modules``. Kept here because this hook must not import anything of ours.
WATCHED_MODULES = {
    "lightning.pytorch.strategies": ("lightning.pytorch", "strategy registry", "StrategyRegistry"),
    "pytorch_lightning.strategies": ("pytorch_lightning", "strategy registry", "StrategyRegistry"),
    "lightning.fabric.strategies": ("lightning.fabric", "strategy registry", "STRATEGY_REGISTRY"),
    "lightning_fabric.strategies": ("lightning_fabric", "strategy registry", "STRATEGY_REGISTRY"),
    "lightning.pytorch.trainer.connectors.accelerator_connector": (
        "lightning.pytorch",
        "connector",
        "_AcceleratorConnector",
    ),
    "pytorch_lightning.trainer.connectors.accelerator_connector": (
        "pytorch_lightning",
        "connector",
        "_AcceleratorConnector",
    ),
    "lightning.fabric.connector": ("lightning.fabric", "connector", "_Connector"),
    "lightning_fabric.connector": ("lightning_fabric", "connector", "_Connector"),
    "lightning.fabric.accelerators.xla": ("lightning.fabric", "xla accelerator", "XLAAccelerator"),
    "lightning_fabric.accelerators.xla": ("lightning_fabric", "xla accelerator", "XLAAccelerator"),
}


# Modules of Lightning integrations that were retired, whose strategies a package of this project provides now:
# module -> (its project on PyPI, the distribution of ours, our import package, the class, the strategy name).
# Importing one that nothing provides raises an error that names the imports to use instead of "No module named";
# where the old project is installed, its module is imported as before.
RETIRED_MODULES = {
    "lightning_colossalai": (
        "lightning-colossalai",
        "lightning-strategies-colossalai-gemini",
        "lightning_strategies_colossalai",
        "ColossalAIStrategy",
        "colossalai",
    ),
}


def retired_module_message(module):
    project, distribution, package, name, strategy = RETIRED_MODULES[module]
    import importlib.util

    message = (
        f"No module named {module!r}: that is the {project} project, a retired Lightning integration, and it is not "
        f"installed. {name} now comes from {distribution}: use `from lightning.pytorch.strategies import {name}` "
        f"(`pytorch_lightning.strategies` with the standalone package) or `from {package} import {name}`, or "
        f'pass strategy="{strategy}".'
    )
    if importlib.util.find_spec(package) is None:
        message += f" Install it first: pip install {distribution}"
    return message


class _RetiredModules:
    """Last on sys.meta_path: a retired module that no other finder provides is an error naming what to import."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in RETIRED_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec") and finder.find_spec(fullname, path, target):
                return None  # installed after all: that finder answers
        raise ModuleNotFoundError(retired_module_message(fullname), name=fullname)


class _CallingLoader:
    """Runs the real loader, then ``after`` on the module it just executed."""

    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after(module)


class ImportWatcher:
    """A meta-path finder that answers only for the modules named, wrapping the real spec's loader so that
    ``after(module)`` runs once each has executed. Core watches with it too: ``lightning_strategies.hugging_face``
    patches peft when a hook imports it."""

    def __init__(self, names, after):
        self._names = names
        self._after = after
        # Names being looked up through the other finders: two watchers of one name would ask each other without
        # end. The import system calls finders under its global import lock, which keeps other threads out meanwhile.
        self._resolving = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._names or fullname in self._resolving:
            return None
        self._resolving.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _CallingLoader(spec.loader, self._after)
                    return spec
            return None
        finally:
            self._resolving.discard(fullname)


def _activate(module):
    try:
        from lightning_strategies.activation import on_lightning_import
    except Exception as error:  # never break Lightning's own import
        sys.stderr.write(f"lightning-strategies: activation unavailable: {error!r}\n")
        return
    on_lightning_import(module.__name__, module)


_watcher = ImportWatcher(WATCHED_MODULES, _activate)
_retired = _RetiredModules()


def install():
    """Watch for Lightning's registries, and answer for retired modules (idempotent)."""
    if _watcher not in sys.meta_path:
        sys.meta_path.insert(0, _watcher)
    if _retired not in sys.meta_path:
        sys.meta_path.append(_retired)


if os.environ.get("LIGHTNING_STRATEGIES_AUTOLOAD", "1") != "0":
    install()
