"""The name lists core uses agree with Lightning itself: 2.6's before Lightning is imported, and what the installed
Lightning registers once it is."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lightning_strategies.known import (
    LIGHTNING_BUILTIN_NAMES,
    LIGHTNING_FABRIC_NAMES,
    LIGHTNING_TRAINER_NAMES,
    lightning_builtin_entry_points,
)
from lightning_strategies.registry import StrategyRegistry
from lightning_strategies.testing import assert_install_hints_match


def test_builtin_names_match_lightnings_registries_per_entry_point():
    # A fresh interpreter with activation off sees Lightning's registries as Lightning made them.
    code = (
        "from lightning.pytorch.strategies import StrategyRegistry as trainer;"
        "from lightning.fabric.strategies import STRATEGY_REGISTRY as fabric;"
        "print(' '.join(sorted(trainer))); print(' '.join(sorted(fabric)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"LIGHTNING_STRATEGIES_AUTOLOAD": "0", "PATH": ""},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    trainer, fabric = result.stdout.splitlines()
    assert set(trainer.split()) == LIGHTNING_TRAINER_NAMES
    assert set(fabric.split()) == LIGHTNING_FABRIC_NAMES


def test_install_hints_list_exactly_the_names_each_installed_project_package_registers():
    # known.py must stay in core (it answers when a package is missing), so it is held to the packages here.
    from lightning_strategies.known import PROJECT_PACKAGES
    from lightning_strategies.plugins import load_installed_plugins
    from lightning_strategies.registry import StrategyRegistry

    registry = StrategyRegistry()
    load_installed_plugins(registry)
    installed = {entry.distribution for entry in registry} & set(PROJECT_PACKAGES)
    if not installed:
        pytest.skip("no project strategy package is installed beside core; each package's tests check its own")
    for distribution in installed:
        assert_install_hints_match(distribution, registry)


NEXT = "lightning_next_release_name_for_tests"


@pytest.fixture
def name_of_a_newer_lightning(monkeypatch: pytest.MonkeyPatch) -> str:
    """A name registered in the Trainer's registry by a class of Lightning's own, as 2.7's fsdp2 is."""
    from lightning.pytorch.strategies import SingleDeviceStrategy, StrategyRegistry

    entry = {"strategy": SingleDeviceStrategy, "description": "new in Lightning", "init_params": {}}
    monkeypatch.setitem(StrategyRegistry, NEXT, entry)
    return NEXT


def test_a_name_a_newer_lightning_registers_is_known_as_its_own(name_of_a_newer_lightning: str) -> None:
    assert name_of_a_newer_lightning in LIGHTNING_TRAINER_NAMES
    assert name_of_a_newer_lightning in LIGHTNING_BUILTIN_NAMES
    assert name_of_a_newer_lightning not in LIGHTNING_FABRIC_NAMES
    assert lightning_builtin_entry_points(name_of_a_newer_lightning) == ("Trainer",)


def test_names_registered_there_by_others_are_not_lightnings(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    class SomeonesStrategy:
        pass

    monkeypatch.setitem(StrategyRegistry, NEXT, {"strategy": SomeonesStrategy, "init_params": {}})
    assert NEXT not in LIGHTNING_BUILTIN_NAMES


def test_replacing_a_name_of_a_newer_lightning_needs_a_declaration(
    name_of_a_newer_lightning: str, registry: StrategyRegistry, add_plugin
) -> None:
    def register_strategies(registry):
        registry.register(name_of_a_newer_lightning, "somewhere:Strategy")

    add_plugin(register_strategies)
    assert name_of_a_newer_lightning not in registry
    assert "replaces_builtin=True" in registry.problems[0].reason


def test_lightning_26s_names_stand_in_before_lightning_is_imported() -> None:
    code = (
        "import sys; from lightning_strategies.known import LIGHTNING_BUILTIN_NAMES as names;"
        "print('lightning' in sys.modules, 'fsdp' in names, 'dp' in names, len(names))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["False", "True", "True", "29"], result.stderr
