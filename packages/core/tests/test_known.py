"""The static name lists core uses without importing Lightning agree with Lightning itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lightning_strategies.known import LIGHTNING_FABRIC_NAMES, LIGHTNING_TRAINER_NAMES
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
