"""``debug=True`` sets torch_xla's debug level for the run only: what was there before, a level the user set
included, is back after teardown, or under Fabric (which never tears its strategy down) once the strategy is gone."""

from __future__ import annotations

import gc
import os

import pytest

from lightning_strategies_xla.body import DEBUG_LEVEL, DEBUG_VARIABLE, DebugSwitchMixin


class _LightningBase:
    def teardown(self) -> None:
        """Lightning's strategy teardown, which the switch runs first."""


class Switched(DebugSwitchMixin, _LightningBase):
    def __init__(self, debug: bool) -> None:
        self.debug = debug


@pytest.mark.parametrize("before", [None, "1"])
def test_the_debug_level_is_put_back_at_teardown(before: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if before is None:
        monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DEBUG_VARIABLE, before)
    strategy = Switched(debug=True)
    strategy._start_debugging()
    assert os.environ[DEBUG_VARIABLE] == DEBUG_LEVEL
    strategy.teardown()
    assert os.environ.get(DEBUG_VARIABLE) == before


def test_the_debug_level_is_put_back_once_a_strategy_never_torn_down_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    strategy = Switched(debug=True)
    strategy._start_debugging()
    del strategy
    gc.collect()
    assert os.environ[DEBUG_VARIABLE] == "1"


def test_without_debug_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    strategy = Switched(debug=False)
    strategy._start_debugging()
    assert DEBUG_VARIABLE not in os.environ
    strategy.teardown()
