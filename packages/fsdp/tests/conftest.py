"""Markers, and running the multi-process scenario groups once per test session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_strategies.conformance.launching import fresh_launch_environment

SCENARIOS = Path(__file__).parent / "scripts" / "scenarios.py"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs (run on the GPU machine with -m gpu)")
    config.addinivalue_line("markers", "tpu: needs a TPU")


def run_group(group: str, out: Path, *extra: str, timeout: int = 400, env: dict[str, str] | None = None) -> Path:
    """Run one scenario group on CPU processes (Lightning launches the second one) and return its output folder."""
    environment = fresh_launch_environment({"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **(env or {})})
    completed = subprocess.run(
        [sys.executable, str(SCENARIOS), group, str(out), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )
    if completed.returncode != 0:
        pytest.fail(f"scenario group {group!r} failed:\n{completed.stdout[-4000:]}\n{completed.stderr[-6000:]}")
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
