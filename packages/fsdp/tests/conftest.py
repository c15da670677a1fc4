"""Running the multi-process scenario groups once per test session (markers and the script runner come from
core's pytest plugin and test kit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_strategies.testing import run_script

SCENARIOS = Path(__file__).parent / "scripts" / "scenarios.py"


def run_group(group: str, out: Path, *extra: str, timeout: int = 400, env: dict[str, str] | None = None) -> Path:
    """Run one scenario group on CPU processes (Lightning launches the second one) and return its output folder."""
    environment = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **(env or {})}
    run_script(SCENARIOS, group, out, *extra, env=environment, timeout=timeout)
    return out


def read(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


@pytest.fixture(scope="session")
def scenario_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scenarios")


@pytest.fixture(scope="session")
def names_run(scenario_root: Path) -> Path:
    return run_group("names", scenario_root / "names")


@pytest.fixture(scope="session")
def reference_run(scenario_root: Path) -> Path:
    return run_group("reference", scenario_root / "reference")


@pytest.fixture(scope="session")
def fabric_run(scenario_root: Path) -> Path:
    return run_group("fabric", scenario_root / "fabric")
