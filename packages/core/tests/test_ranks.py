"""The failed-rank watchdog, on a real two-process gloo group: every failure ends both ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lightning_strategies.ranks import EXIT_CODE, TIMEOUT_VARIABLE, failed_rank_timeout
from lightning_strategies.testing import free_port

WORKER = Path(__file__).with_name("rank_worker.py")
# Far below the 30-minute process-group timeout a survivor would otherwise wait for.
NO_HANG = 120


def run_ranks(
    scenario: str, failing_rank: int = 1, timeout: str = "3", stays_stopped: bool = False
) -> list[subprocess.CompletedProcess]:
    """Run both ranks to their end; a rank that ``stays_stopped`` is killed once the other ended."""
    port = str(free_port())
    environment = {**os.environ, TIMEOUT_VARIABLE: timeout, "FAILING_RANK": str(failing_rank)}
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), port, scenario],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    results = []
    try:
        order = sorted(range(2), key=lambda rank: stays_stopped and rank == failing_rank)
        for rank in order:
            if stays_stopped and rank == failing_rank:
                os.kill(processes[rank].pid, signal.SIGKILL)
            process = processes[rank]
            stdout, stderr = process.communicate(timeout=NO_HANG)
            results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return sorted(results, key=lambda result: int(result.args[2]))


def test_a_clean_run_exits_zero_on_every_rank_even_when_rank_0_leaves_first() -> None:
    results = run_ranks("clean", timeout="1")
    for rank, result in enumerate(results):
        assert result.returncode == 0, result.stderr
        assert f"rank {rank} finished" in result.stdout
        assert "terminate called" not in result.stderr


@pytest.mark.parametrize("failing_rank", [0, 1])
def test_an_uncaught_exception_ends_the_other_rank_naming_the_failed_one(failing_rank: int) -> None:
    results = run_ranks("raise", failing_rank=failing_rank)
    failed, survivor = results[failing_rank], results[1 - failing_rank]
    assert failed.returncode == 1 and "training_step failed on purpose" in failed.stderr
    assert survivor.returncode == EXIT_CODE, survivor.stderr
    assert f"rank {failing_rank} exited with an uncaught ValueError" in survivor.stderr
    assert "passed the all-reduce" not in survivor.stdout
    # Named once, in sentences that end once (the error's own text ends with a period).
    assert survivor.stderr.count(f"rank {failing_rank} exited with an uncaught") == 1, survivor.stderr
    assert ".." not in survivor.stderr


@pytest.mark.parametrize("attempt", range(3))
def test_the_same_error_on_every_rank_exits_1_on_each_blaming_no_other(attempt: int) -> None:
    # Each rank failed on its own: each exits with its own error's code and blames nobody,
    # whichever rank's record the store took first.
    for result in run_ranks("both"):
        assert result.returncode == 1, result.stderr
        assert "training_step failed on purpose" in result.stderr
        assert "lightning-strategies:" not in result.stderr, result.stderr


def test_a_reported_exception_ends_the_other_rank_while_the_failed_one_still_runs() -> None:
    results = run_ranks("report")
    assert results[0].returncode == EXIT_CODE, results[0].stderr
    assert "rank 1 raised ValueError: training_step failed on purpose" in results[0].stderr
    # Rank 0 took the store with it; the failed rank, its failure recorded, does not linger, and
    # exits with the code of a rank that raised, as it did.
    assert results[1].returncode == 1, results[1].stderr


def test_a_killed_rank_is_named_by_the_survivor() -> None:
    results = run_ranks("kill")
    assert results[1].returncode == -signal.SIGKILL
    assert results[0].returncode != 0
    assert "rank 1 (process" in results[0].stderr and "is gone" in results[0].stderr


def test_a_silent_rank_is_declared_dead_after_the_timeout() -> None:
    results = run_ranks("stop", timeout="2", stays_stopped=True)
    assert results[0].returncode == EXIT_CODE, results[0].stderr
    assert "rank 1 stopped responding: no heartbeat" in results[0].stderr


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_a_bad_timeout_names_the_variable(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_VARIABLE, value)
    with pytest.raises(ValueError, match=TIMEOUT_VARIABLE):
        failed_rank_timeout()


def test_reporting_never_masks_the_users_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Called from the Trainer's on_exception: an error raised here would replace the user's.
    from lightning_strategies import ranks

    class WatchdogWithoutStore:
        stopped = threading.Event()

        def failure(self) -> str | None:
            raise ConnectionError("the store went with rank 0")

    monkeypatch.setattr(ranks, "_watchdog", WatchdogWithoutStore())
    assert ranks.report_failure(ValueError("the user's error")) is None
