"""The reliability tier: saves killed mid-way, resumes after kills, and ranks that fail.

Each check drives real training runs of ``scenarios.py`` in fresh process groups and kills
them with SIGKILL (every rank at once, as a preempted node would be):

- crash-safe save: kills land inside checkpoint saves (at a random point of a save) and
  between them; after each, the next run resumes from ``last.ckpt`` and must start right after
  the newest save that was complete when the kill came (or the one being written, if its
  publication beat the kill), never earlier and never from a partial checkpoint;
- resume after kill: the run that was killed and resumed again and again ends with the same
  predictions as a run that was never interrupted;
- failed-rank exit: one rank raises, or is killed, in training; every rank must exit, and the
  output must name the failed rank. The time from failure to the last exit is reported.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_strategies.conformance.launching import fresh_launch_environment

CHECKPOINTS = "checkpoints"  # the scenario run's ModelCheckpoint folder
FAILED_AT = "failed-at"  # where the failing rank writes the time it failed
# Where each successive kill lands: at a random point of a last.ckpt save, or of the epoch after one.
_KILL_PATTERN = ("inside-save", "mid-epoch", "inside-save", "inside-save", "mid-epoch")
# Resuming reads last.ckpt only: its saves are the ones whose interruption matters.
_LAST_BEGIN, _LAST_END = "save-begin last.ckpt", "save-end last.ckpt"
_NO_EVENT = 30.0  # seconds beyond the caller's timeout share after which a silent run has hung


@dataclass
class RunOptions:
    strategy: str
    accelerator: str
    devices: int
    precision: str
    timeout: float
    tolerance: float
    seed: int = 0
    kills: int = len(_KILL_PATTERN)

    @property
    def kill_plan(self) -> list[str]:
        return [_KILL_PATTERN[index % len(_KILL_PATTERN)] for index in range(self.kills)]

    @property
    def max_epochs(self) -> int:
        return 2 * self.kills + 2  # each killed run gets at most two epochs further


@dataclass
class _Run:
    """A scenario run whose rank-0 events are read as they come."""

    command: list[str]
    process: subprocess.Popen = field(init=False)
    events: queue.Queue = field(default_factory=queue.Queue)
    output: list[str] = field(default_factory=list)
    killed_by_driver: bool = False

    def __post_init__(self) -> None:
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=fresh_launch_environment(),
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if line.startswith("@"):
                self.events.put((time.monotonic(), line[1:].strip()))
        self.events.put((time.monotonic(), "exit"))

    def next_event(self, timeout: float) -> tuple[float, str]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise TimeoutError(f"no progress for {timeout:.0f} s; last output:\n{self.tail()}") from None

    def wait_for(self, prefix: str, timeout: float) -> tuple[float, str]:
        while True:
            when, event = self.next_event(timeout)
            if event.startswith(prefix):
                return when, event
            if event == "exit":
                raise RuntimeError(f"the run ended before '{prefix}'; last output:\n{self.tail()}")

    def remaining_events(self) -> list[str]:
        """Events printed before the process ended (call after ``kill``)."""
        remaining = []
        while (event := self.next_event(_NO_EVENT)[1]) != "exit":
            remaining.append(event)
        return remaining

    def kill(self) -> None:
        self.killed_by_driver = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def finish(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -signal.SIGKILL

    def tail(self, lines: int = 25) -> str:
        return "".join(self.output[-lines:])


def _command(options: RunOptions, workdir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "lightning_strategies.conformance.scenarios",
        "--strategy", options.strategy, "--accelerator", options.accelerator,
        "--devices", str(options.devices), "--precision", options.precision,
        "--workdir", str(workdir), "--max-epochs", str(options.max_epochs), *extra,
    ]  # fmt: skip


def _epoch(event: str) -> int:
    return int(event.rsplit("=", 1)[1])


def saves_at_kill(late_events: list[str], newest_complete: int, being_written: int) -> tuple[int, int]:
    """The newest complete ``last.ckpt`` and the one being written when the kill came.

    ``late_events`` are those the run printed between the driver's last look and the kill. A
    save can begin there too: an epoch can be shorter than a save, so the next save may start
    while the driver sleeps before a "mid-epoch" kill, and its publication may beat the kill.
    """
    for event in late_events:
        if event.startswith(_LAST_BEGIN):
            being_written = _epoch(event)
        elif event.startswith(_LAST_END):
            newest_complete = _epoch(event)
    return newest_complete, being_written


def check_kills_and_resume(options: RunOptions, workdir: Path) -> list[dict[str, Any]]:
    """Crash-safe save and resume-after-kill results."""
    rng = random.Random(options.seed)
    interrupted, uninterrupted = workdir / "interrupted", workdir / "uninterrupted"
    kills: list[str] = []
    problems: list[str] = []
    save_seconds = 0.5  # refined from the first complete save
    newest_complete, being_written = -1, -1
    resume = False
    try:
        for plan in options.kill_plan:
            run = _Run(_command(options, interrupted, *(["--resume"] if resume else [])))
            _, event = run.wait_for("resumed", options.timeout)
            start = _epoch(event)
            if resume and start not in (newest_complete + 1, being_written + 1):
                problems.append(
                    f"after a kill, training restarted at epoch {start}; the newest complete checkpoint was of "
                    f"epoch {newest_complete} (the one being written: {being_written})"
                )
            begun, event = run.wait_for(_LAST_BEGIN, options.timeout)
            being_written = _epoch(event)
            ended, _ = run.wait_for(_LAST_END, options.timeout)
            save_seconds = ended - begun
            newest_complete = being_written
            if plan == "inside-save":
                _, event = run.wait_for(_LAST_BEGIN, options.timeout)
                being_written = _epoch(event)
                time.sleep(rng.uniform(0.1, 0.9) * save_seconds)
            else:
                time.sleep(rng.uniform(0, save_seconds))
            run.kill()
            late = run.remaining_events()
            newest_complete, being_written = saves_at_kill(late, newest_complete, being_written)
            inside = being_written != newest_complete  # a save had begun and not ended, whatever the plan
            if not (interrupted / CHECKPOINTS / "last.ckpt").exists():
                problems.append(f"no last.ckpt after a kill {'inside' if inside else 'between'} saves")
            kills.append("inside a save" if inside else "between saves")
            resume = True
        final = _Run(_command(options, interrupted, "--resume"))
        _, event = final.wait_for("resumed", options.timeout)
        start = _epoch(event)
        if start not in (newest_complete + 1, being_written + 1):
            problems.append(f"the final resume restarted at epoch {start}, newest complete was {newest_complete}")
        final.wait_for("done", options.timeout)
        final.finish(_NO_EVENT)
        reference = _Run(_command(options, uninterrupted))
        reference.wait_for("done", options.timeout)
        reference.finish(_NO_EVENT)
    except (TimeoutError, RuntimeError) as error:
        return [{"check": "crash-safe save", "passed": False, "detail": str(error)}]

    inside_saves = kills.count("inside a save")
    safe = {
        "check": "crash-safe save",
        "passed": not problems,
        "detail": "; ".join(problems)
        or f"{len(kills)} kills ({inside_saves} inside a save), each resumed from the newest complete checkpoint",
        "measured": {"kills": len(kills), "inside_a_save": inside_saves, "resumes": len(kills)},
    }
    return [safe, _compare_predictions(options, interrupted, uninterrupted, len(kills))]


def _compare_predictions(options: RunOptions, interrupted: Path, uninterrupted: Path, kills: int) -> dict[str, Any]:
    import torch

    differences = []
    for rank in range(options.devices):
        name = f"predictions.rank{rank}.pt"
        got = torch.load(interrupted / name, weights_only=True)
        expected = torch.load(uninterrupted / name, weights_only=True)
        scale = max(1.0, float(expected.abs().max()))
        differences.append(float((got - expected).abs().max()) / scale)
    worst = max(differences)
    return {
        "check": "resume after kill",
        "passed": worst <= options.tolerance,
        "detail": f"killed {kills} times and resumed vs never interrupted: max relative difference {worst:.3g} "
        f"(tolerance {options.tolerance:g})",
        "measured": {"max_relative_difference": worst, "tolerance": options.tolerance},
    }


def check_failed_rank(options: RunOptions, workdir: Path, how: str) -> dict[str, Any]:
    """One rank fails at its third step; all must exit, naming it. Reports the time to exit."""
    failing = options.devices - 1
    workdir.mkdir(parents=True, exist_ok=True)
    run = _Run(_command(options, workdir, "--fail-rank", str(failing), "--fail-how", how))
    bound = _failed_rank_bound()
    code = run.finish(options.timeout + bound)
    ended = time.time()
    check = f"failed-rank exit ({'raises' if how == 'raise' else 'killed'})"
    if not (workdir / FAILED_AT).exists():
        return {"check": check, "passed": False, "detail": f"rank {failing} never failed; output:\n{run.tail()}"}
    seconds = ended - float((workdir / FAILED_AT).read_text())
    # "rank 1" (ours), or "[rank: 1]" (Lightning's launcher, when it ends every process after a child died).
    named = re.search(rf"\brank:? {failing}\b", "".join(run.output)) is not None
    passed = code != 0 and not run.killed_by_driver and named
    detail = f"every rank exited {seconds:.1f} s after rank {failing} failed (exit code {code})"
    if run.killed_by_driver:
        detail = f"ranks were still running {seconds:.0f} s after rank {failing} failed and were killed"
    elif not named:
        detail += f", but no output names rank {failing}"
    measured = {"seconds_to_exit": round(seconds, 2), "exit_code": code, "failed_rank_named": named}
    return {"check": check, "passed": passed, "detail": detail, "measured": measured}


def _failed_rank_bound() -> float:
    from lightning_strategies.ranks import failed_rank_timeout

    return failed_rank_timeout() + _NO_EVENT


def run_reliability_tier(options: RunOptions, workdir: Path) -> list[dict[str, Any]]:
    results = check_kills_and_resume(options, workdir / "kills")
    if options.devices > 1:
        for how in ("raise", "kill"):
            results.append(check_failed_rank(options, workdir / f"failed-rank-{how}", how))
    return results
