"""Strategy classes for the standalone ``pytorch_lightning`` and ``lightning_fabric`` packages,
built from the one ``lightning.pytorch`` / ``lightning.fabric`` source a plugin ships.

``pytorch_lightning.Trainer`` accepts only ``pytorch_lightning`` strategy classes, which share
no base classes with ``lightning.pytorch``. Lightning publishes ``pytorch_lightning`` by
rewriting ``lightning.pytorch`` imports; this module does the same at import time, so a plugin
author writes a strategy once. A module ``pkg.mod`` is mirrored as
``lightning_strategies._mirror.<flavour>.pkg.mod``: its source is compiled with
``lightning.pytorch`` -> ``pytorch_lightning``, ``lightning.fabric`` -> ``lightning_fabric``, and
absolute imports of its own top-level package redirected into the mirror. Relative imports work
unchanged. Modules outside the plugin's package (core included) are shared, not mirrored, so
core keeps one registry.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import re
import sys
import threading
from types import ModuleType
from typing import Any

PREFIX = "lightning_strategies._mirror"
FLAVOURS = ("pytorch_lightning", "lightning_fabric")
_REWRITES = (
    (re.compile(r"\blightning\.pytorch\b"), "pytorch_lightning"),
    (re.compile(r"\blightning\.fabric\b"), "lightning_fabric"),
)


def mirrored_source(source: str, flavour: str, top_package: str) -> str:
    """``source`` rewritten for ``flavour``; ``top_package`` imports are redirected into the mirror."""
    for pattern, replacement in _REWRITES:
        source = pattern.sub(replacement, source)
    own_imports = re.compile(rf"^(\s*)(from|import)(\s+){re.escape(top_package)}\b", re.MULTILINE)
    return own_imports.sub(rf"\1\2\3{PREFIX}.{flavour}.{top_package}", source)


class _MirrorFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(PREFIX + "."):
            return None
        flavour, _, original = fullname[len(PREFIX) + 1 :].partition(".")
        if flavour not in FLAVOURS:
            return None
        if not original:  # lightning_strategies._mirror.<flavour> itself: an empty package
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        original_spec = importlib.util.find_spec(original)
        if original_spec is None or original_spec.loader is None:
            return None
        is_package = original_spec.submodule_search_locations is not None
        spec = importlib.util.spec_from_loader(fullname, self, origin=original_spec.origin, is_package=is_package)
        assert spec is not None
        spec.has_location = original_spec.has_location
        return spec

    def create_module(self, spec: Any) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        flavour, _, original = module.__name__[len(PREFIX) + 1 :].partition(".")
        if not original:
            return
        if module.__spec__ is not None and module.__spec__.submodule_search_locations is not None:
            module.__path__ = []  # submodules are found by name, through this finder
        original_spec = importlib.util.find_spec(original)
        if original_spec is None or original_spec.loader is None:
            raise ImportError(f"Cannot mirror {original!r} for {flavour}: the module is not installed.")
        source = original_spec.loader.get_source(original)  # type: ignore[attr-defined]
        if source is None:
            raise ImportError(f"Cannot mirror {original!r} for {flavour}: its source is not available.")
        code = compile(
            mirrored_source(source, flavour, original.split(".")[0]), original_spec.origin or original, "exec"
        )
        module.__file__ = original_spec.origin
        exec(code, module.__dict__)


_finder = _MirrorFinder()
_install_lock = threading.Lock()


def install() -> None:
    """Put the mirror finder on ``sys.meta_path`` (idempotent)."""
    with _install_lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
