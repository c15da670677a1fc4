"""Runs under every FSDP name leave the process as they found it: nothing in os.environ, torch's switches, log
levels or Lightning's registries beyond what Lightning's own ``ddp`` leaves."""

from __future__ import annotations

from lightning_strategies.testing import side_effects_of_runs
from lightning_strategies_fsdp.plugin import NAMES


def test_trainer_runs_change_nothing() -> None:
    assert side_effects_of_runs(list(NAMES)) == {name: {} for name in NAMES}


def test_fabric_runs_change_nothing_once_the_strategy_is_gone() -> None:
    assert side_effects_of_runs(list(NAMES), fabric=True) == {name: {} for name in NAMES}
