"""Fixtures for core's tests: a registry that ignores installed plugins, and throwaway plugin
distributions that real entry-point discovery finds."""

from __future__ import annotations

import inspect
import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_strategies import hookimpl
from lightning_strategies import registry as registry_module
from lightning_strategies.plugins import register_plugin
from lightning_strategies.registry import StrategyRegistry


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[StrategyRegistry]:
    """An empty process-wide registry: core's tests never see installed plugins."""
    empty = StrategyRegistry()
    monkeypatch.setattr(registry_module, "_registry", empty)
    yield empty


@pytest.fixture
def installed_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process-wide registry reloaded from what is installed now (after on_path)."""
    monkeypatch.setattr(registry_module, "_registry", None)


@pytest.fixture
def lightning_registries() -> Iterator[list]:
    """Lightning's four registries, restored after the test so names do not leak between tests."""
    import lightning.fabric.strategies as fabric
    import lightning.pytorch.strategies as trainer
    import lightning_fabric.strategies as standalone_fabric
    import pytorch_lightning.strategies as standalone_trainer

    registries = [
        trainer.StrategyRegistry,
        standalone_trainer.StrategyRegistry,
        fabric.STRATEGY_REGISTRY,
        standalone_fabric.STRATEGY_REGISTRY,
    ]
    saved = [dict(registry) for registry in registries]
    yield registries
    for registry, contents in zip(registries, saved, strict=True):
        registry.clear()
        registry.update(contents)


@pytest.fixture
def add_plugin(registry: StrategyRegistry) -> Callable[..., None]:
    """Register a plugin object (anything with hook implementations) as if a distribution shipped it; a bare
    function stands for a plugin whose one hook is that function (named as the hook)."""

    def add(plugin: object, name: str = "throwaway", distribution: str = "throwaway-dist") -> None:
        if inspect.isfunction(plugin):
            plugin = SimpleNamespace(**{plugin.__name__: hookimpl(plugin)})
        register_plugin(registry, plugin, name, distribution, "1.0")

    return add


def write_distribution(
    root: Path, distribution: str, modules: dict[str, str], entry_points: dict[str, str], version: str = "1.0"
) -> Path:
    """A minimal installed distribution (a .dist-info folder and its modules) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        path = root / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    info = root / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    info.joinpath("entry_points.txt").write_text(f"[lightning_strategies]\n{lines}")
    return root


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Put a folder of throwaway distributions on sys.path and PYTHONPATH (for subprocesses)."""

    def add(folder: Path) -> None:
        monkeypatch.syspath_prepend(str(folder))
        existing = os.environ.get("PYTHONPATH")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), existing])))

    return add
