"""What a strategy sets in os.environ for a run goes back as it was, and nothing of anyone else's with it."""

from __future__ import annotations

import os

import pytest

from lightning_strategies.environment_changes import EnvironmentChanges

NAME = "LIGHTNING_STRATEGIES_TEST_VARIABLE"


@pytest.mark.parametrize("before", [None, "the user's"])
def test_a_set_variable_is_put_back(before: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if before is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, before)
    changes = EnvironmentChanges()
    changes.set(NAME, "first")
    changes.update({NAME: "second"})
    assert os.environ[NAME] == "second"
    changes.restore()
    assert os.environ.get(NAME) == before


def test_what_a_block_changes_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NAME, "kept")
    monkeypatch.setenv(NAME + "_REMOVED", "removed by the block")
    changes = EnvironmentChanges()
    with changes.recording():  # a backend's import, say
        os.environ[NAME + "_ADDED"] = "added"
        del os.environ[NAME + "_REMOVED"]
    changes.restore()
    assert NAME + "_ADDED" not in os.environ
    assert os.environ[NAME + "_REMOVED"] == "removed by the block"
    assert os.environ[NAME] == "kept"


def test_a_value_changed_since_by_someone_else_is_theirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAME, raising=False)
    changes = EnvironmentChanges()
    changes.set(NAME, "ours")
    os.environ[NAME] = "the user's, set during the run"
    changes.restore()
    assert os.environ[NAME] == "the user's, set during the run"


def test_restore_happens_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAME, raising=False)
    changes = EnvironmentChanges()
    changes.set(NAME, "ours")
    changes.restore()
    os.environ[NAME] = "a later run's"
    changes.restore()
    assert os.environ[NAME] == "a later run's"
