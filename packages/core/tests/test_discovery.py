"""Entry-point discovery with real (throwaway) installed distributions, in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import write_distribution

from lightning_strategies.plugins import load_installed_plugins
from lightning_strategies.registry import StrategyRegistry

SOUND = {
    "sound_plugin": """
        from lightning_strategies import hookimpl

        @hookimpl
        def register_strategies(registry):
            registry.register("sound", "lightning.pytorch.strategies:DDPStrategy", description="sound")
    """
}
BROKEN = {"broken_plugin": "raise ImportError('this plugin is broken on purpose')\n"}


@pytest.fixture
def distributions(tmp_path, on_path):
    folder = tmp_path / "site"
    write_distribution(folder, "sound-dist", SOUND, {"sound": "sound_plugin"})
    write_distribution(folder, "broken-dist", BROKEN, {"broken": "broken_plugin"})
    on_path(folder)
    return folder


def test_installed_plugins_are_found_and_broken_ones_reported(distributions):
    registry = StrategyRegistry()
    load_installed_plugins(registry)
    assert registry.entry("sound").provider == "sound-dist 1.0"
    broken = [problem for problem in registry.problems if problem.plugin == "broken"]
    assert broken and broken[0].distribution == "broken-dist"
    assert "broken on purpose" in broken[0].reason


@pytest.mark.parametrize(
    ("disable", "expected"),
    [
        ("sound", False),
        ("broken,sound", False),
        ("*", False),
        ("other", True),
        ("sound-dist", False),  # the distribution name, as pip knows it
        ("Sound_Dist", False),
        ("broken sound", False),
    ],
)
def test_entry_points_can_be_disabled(distributions, monkeypatch, disable, expected):
    monkeypatch.setenv("LIGHTNING_STRATEGIES_DISABLE", disable)
    registry = StrategyRegistry()
    load_installed_plugins(registry)
    assert ("sound" in registry) is expected


@pytest.mark.parametrize(
    ("disable", "hint"),
    [
        ("soundd", "Did you mean 'sound'?"),
        ("sound_plugin", "It takes entry-point or distribution names"),
    ],
)
def test_disable_values_that_match_nothing_are_reported(distributions, monkeypatch, capsys, disable, hint):
    monkeypatch.setenv("LIGHTNING_STRATEGIES_DISABLE", disable)
    registry = StrategyRegistry()
    load_installed_plugins(registry)
    assert "sound" in registry
    assert len(registry.disable_problems) == 1
    assert f"LIGHTNING_STRATEGIES_DISABLE={disable!r} matches no installed plugin" in registry.disable_problems[0]
    assert hint in registry.disable_problems[0]


def test_a_strategy_name_in_disable_names_its_plugin(tmp_path, on_path, monkeypatch):
    module = SOUND["sound_plugin"].replace('"sound"', '"team_ddp"').replace("sound_plugin", "team_plugin")
    folder = write_distribution(tmp_path / "site", "team-dist", {"team_plugin": module}, {"team": "team_plugin"})
    on_path(folder)
    monkeypatch.setenv("LIGHTNING_STRATEGIES_DISABLE", "team_ddp")
    registry = StrategyRegistry()
    load_installed_plugins(registry)
    assert (
        "'team_ddp' is a strategy name; its plugin is 'team': LIGHTNING_STRATEGIES_DISABLE=team"
        in (registry.disable_problems[0])
    )


def test_unmatched_disable_values_reach_stderr_and_doctor(distributions):
    import os

    result = subprocess.run(
        [sys.executable, "-m", "lightning_strategies.cli", "doctor"],
        capture_output=True,
        text=True,
        env={**os.environ, "LIGHTNING_STRATEGIES_DISABLE": "lightning-strategies-nonesuch"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "'lightning-strategies-nonesuch' matches no installed plugin" in result.stderr
    assert "'lightning-strategies-nonesuch' matches no installed plugin" in result.stdout


def _fresh_python(code: str, **env: str) -> str:
    import os

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_a_fresh_interpreter_resolves_the_name_without_importing_us(distributions):
    code = (
        "import lightning.pytorch as pl, json;"
        "t = pl.Trainer(strategy='sound', accelerator='cpu', devices=1, logger=False);"
        "print(json.dumps(type(t.strategy).__name__))"
    )
    assert json.loads(_fresh_python(code)) == "DDPStrategy"


def test_autoload_can_be_turned_off_and_activated_by_hand(distributions):
    code = (
        "import lightning.pytorch as pl;"
        "names = set(pl.strategies.StrategyRegistry);"
        "import lightning_strategies; lightning_strategies.activate();"
        "print('sound' in names, 'sound' in pl.strategies.StrategyRegistry)"
    )
    assert _fresh_python(code, LIGHTNING_STRATEGIES_AUTOLOAD="0") == "False True"


def test_the_start_up_hook_imports_nothing_heavy():
    heavy = ("torch", "lightning", "pluggy", "lightning_strategies")
    code = f"import sys; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    assert _fresh_python(code) == "[]"
    assert _fresh_python("import sys; print('_lightning_strategies_autoload' in sys.modules)") == "True"
