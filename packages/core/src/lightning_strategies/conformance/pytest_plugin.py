"""pytest plugin of the conformance kit, loaded automatically where lightning-strategies is installed.

Plugin authors get the ``strategy_conformance`` fixture::

    def test_my_strategy_conforms(strategy_conformance):
        report = strategy_conformance("acme", accelerator="cpu", devices=2)
        assert report.passed, report

and the test kit every package of this project uses (``lightning_strategies.testing``): the ``gpu`` and
``tpu`` markers, ``free_port`` (a port for a rendezvous) and ``run_script`` (runs a script that launches
ranks in a fresh environment, failing with the tail of its output).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from lightning_strategies import testing
from lightning_strategies.conformance import CheckReport, run_check


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run with -m gpu on a GPU machine)")
    config.addinivalue_line("markers", "tpu: needs a TPU VM (run with -m tpu there)")


@pytest.fixture
def strategy_conformance(tmp_path) -> Callable[..., CheckReport]:
    """Run the conformance suite against a registered strategy name; returns the report."""

    def check(strategy: str, **options) -> CheckReport:
        options.setdefault("workdir", tmp_path / f"conformance-{strategy}")
        return run_check(strategy, **options)

    return check


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, for a rendezvous."""
    return testing.free_port()


@pytest.fixture
def run_script() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``lightning_strategies.testing.run_script``: runs a script in a fresh launch environment."""
    return testing.run_script
