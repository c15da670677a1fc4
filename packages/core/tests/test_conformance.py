"""The conformance kit passes a sound strategy and fails one whose checkpoints lose the weights."""

from __future__ import annotations

import signal

import pytest
from conftest import write_distribution

from lightning_strategies.cli import main

FORGETFUL = {
    "forgetful_plugin": """
        from lightning_strategies import hookimpl

        @hookimpl
        def register_strategies(registry):
            registry.register("forgetful_ddp", "forgetful_strategy:ForgetfulDDPStrategy")
    """,
    "forgetful_strategy": """
        from lightning.pytorch.strategies import DDPStrategy

        class ForgetfulDDPStrategy(DDPStrategy):
            '''Saves checkpoints but ignores the weights when loading them.'''

            def load_model_state_dict(self, checkpoint, strict=True):
                pass
    """,
}


# Passes every check, then aborts at interpreter exit, as gloo's threads can when a group is left to exit.
ABORTING = {
    "aborting_plugin": """
        from lightning_strategies import hookimpl

        @hookimpl
        def register_strategies(registry):
            registry.register("aborting_ddp", "aborting_strategy:AbortingDDPStrategy")
    """,
    "aborting_strategy": """
        import atexit
        import os

        from lightning.pytorch.strategies import DDPStrategy

        atexit.register(os.abort)

        class AbortingDDPStrategy(DDPStrategy):
            pass
    """,
}


@pytest.fixture
def forgetful(tmp_path, on_path):
    on_path(write_distribution(tmp_path / "site", "forgetful-dist", FORGETFUL, {"forgetful": "forgetful_plugin"}))


@pytest.fixture
def aborting(tmp_path, on_path):
    on_path(write_distribution(tmp_path / "site", "aborting-dist", ABORTING, {"aborting": "aborting_plugin"}))


def test_a_sound_strategy_passes_on_two_processes(strategy_conformance):
    report = strategy_conformance("ddp", accelerator="cpu", devices=2)
    assert report.passed, report
    checks = {result["check"] for result in report.results}
    assert {"all_gather [rank 1]", "resume equality [rank 0]", "checkpoint round trip [rank 1]"} <= checks


def test_a_strategy_losing_weights_on_load_fails(forgetful, strategy_conformance):
    report = strategy_conformance("forgetful_ddp", accelerator="cpu", devices=1)
    assert not report.passed
    failed = {result["check"] for result in report.results if not result["passed"]}
    assert "checkpoint round trip" in failed
    assert "FAIL  checkpoint round trip" in str(report)


def test_check_command_exits_non_zero_with_a_readable_report(forgetful, installed_registry, capsys):
    assert main(["check", "forgetful_ddp", "--accelerator", "cpu", "--devices", "1"]) == 1
    output = capsys.readouterr().out
    assert "FAIL  checkpoint round trip" in output and "RESULT: FAILED" in output


def test_a_run_that_aborts_after_passing_its_checks_fails_and_says_how_it_ended(aborting, strategy_conformance):
    report = strategy_conformance("aborting_ddp", accelerator="cpu", devices=1)
    assert report.results and all(result["passed"] for result in report.results)
    assert not report.passed
    assert f"every check passed, then the run exited with code {-signal.SIGABRT}" in str(report)
