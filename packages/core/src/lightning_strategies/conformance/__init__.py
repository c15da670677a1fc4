"""The conformance kit: the same suite behind ``lightning-strategies check`` and the pytest plugin.

``run_check`` runs the suite in a fresh process (Lightning launches the other ranks from it),
so a strategy under test can neither leak state into the caller nor hang it past ``timeout``.
Importing this package imports neither torch nor Lightning.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lightning_strategies.conformance.launching import fresh_launch_environment, rank_report_files

__all__ = [
    "TIERS",
    "CheckReport",
    "run_check",
]


@dataclass
class CheckReport:
    strategy: str
    accelerator: str
    devices: int
    precision: str
    results: list[dict] = field(default_factory=list)
    returncode: int = 0
    output: str = ""

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and bool(self.results) and all(result["passed"] for result in self.results)

    def __str__(self) -> str:
        title = (
            f"conformance of {self.strategy!r} (accelerator={self.accelerator}, devices={self.devices}, "
            f"precision={self.precision})"
        )
        lines = [title]
        for result in self.results:
            if result["check"] == "traceback":
                continue
            mark = "PASS" if result["passed"] else "FAIL"
            lines.append(f"  {mark}  {result['check']:<34} {result['detail']}")
        # Where the checks do not explain how the run ended, its last output does.
        unexplained = ""
        if not self.results:
            unexplained = f"no report was written (exit code {self.returncode})"
        elif self.returncode != 0 and all(result["passed"] for result in self.results):
            unexplained = f"every check passed, then the run exited with code {self.returncode}"
        if unexplained:
            lines.append(f"  FAIL  {unexplained}; last output:")
            lines.extend("        " + line for line in self.output.strip().splitlines()[-25:])
        failed_tracebacks = [result["detail"] for result in self.results if result["check"] == "traceback"]
        for trace in failed_tracebacks[:1]:
            lines.append("  traceback of the first failure:")
            lines.extend("        " + line for line in trace.strip().splitlines())
        lines.append("RESULT: " + ("passed" if self.passed else "FAILED"))
        return "\n".join(lines)


TIERS = ("basic", "reliability")


def run_check(
    strategy: str,
    accelerator: str = "cpu",
    devices: int = 1,
    precision: str = "32-true",
    timeout: float = 900,
    workdir: str | os.PathLike[str] | None = None,
    tiers: Sequence[str] = ("basic",),
) -> CheckReport:
    """Run the conformance tiers for ``strategy`` in new processes and collect every rank's report.

    ``basic``: stages, collectives, checkpoint round trip and resume equality. ``reliability``:
    saves killed mid-way, resume after kills, and failed-rank exit (see ``reliability.py``).
    """
    unknown = [tier for tier in tiers if tier not in TIERS]
    if unknown:
        raise ValueError(f"Unknown conformance tier(s) {unknown}; choose from {list(TIERS)}.")
    with tempfile.TemporaryDirectory(prefix="lightning-strategies-check-") as scratch:
        directory = Path(workdir) if workdir else Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        report = CheckReport(strategy, accelerator, devices, precision)
        if "basic" in tiers:
            _run_basic_tier(report, directory, timeout)
        if "reliability" in tiers and ("basic" not in tiers or report.passed):
            from lightning_strategies.conformance.reliability import RunOptions, run_reliability_tier
            from lightning_strategies.conformance.tolerances import tolerance_for

            options = RunOptions(strategy, accelerator, devices, precision, timeout, tolerance_for(precision))
            report.results.extend(run_reliability_tier(options, directory / "reliability"))
        return report


def _run_basic_tier(report: CheckReport, directory: Path, timeout: float) -> None:
    report_prefix = str(directory / "report")
    command = [
        sys.executable, "-m", "lightning_strategies.conformance",
        "--strategy", report.strategy, "--accelerator", report.accelerator, "--devices", str(report.devices),
        "--precision", report.precision, "--workdir", str(directory), "--report", report_prefix,
    ]  # fmt: skip
    report.returncode, report.output = _run(command, timeout)
    for rank_file in rank_report_files(directory):
        rank = rank_file.stem.removeprefix("report.rank")
        for result in json.loads(rank_file.read_text()):
            if report.devices > 1:
                result["check"] = f"{result['check']} [rank {rank}]"
            report.results.append(result)


def _run(command: list[str], timeout: float) -> tuple[int, str]:
    # A new session, so a timeout can end the launched ranks along with the first one.
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=fresh_launch_environment(),
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return -1, output + f"\n(timed out after {timeout:.0f} s; all ranks were killed)"
    return process.returncode, output
