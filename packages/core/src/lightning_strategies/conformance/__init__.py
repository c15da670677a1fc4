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
from dataclasses import dataclass, field
from pathlib import Path


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
        if not self.results:
            lines.append(f"  FAIL  no report was written (exit code {self.returncode}); last output:")
            lines.extend("        " + line for line in self.output.strip().splitlines()[-25:])
        failed_tracebacks = [result["detail"] for result in self.results if result["check"] == "traceback"]
        for trace in failed_tracebacks[:1]:
            lines.append("  traceback of the first failure:")
            lines.extend("        " + line for line in trace.strip().splitlines())
        lines.append("RESULT: " + ("passed" if self.passed else "FAILED"))
        return "\n".join(lines)


def run_check(
    strategy: str,
    accelerator: str = "cpu",
    devices: int = 1,
    precision: str = "32-true",
    timeout: float = 900,
    workdir: str | os.PathLike[str] | None = None,
) -> CheckReport:
    """Run the conformance suite for ``strategy`` in a new process and collect every rank's report."""
    with tempfile.TemporaryDirectory(prefix="lightning-strategies-check-") as scratch:
        directory = Path(workdir) if workdir else Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        report_prefix = str(directory / "report")
        command = [
            sys.executable, "-m", "lightning_strategies.conformance",
            "--strategy", strategy, "--accelerator", accelerator, "--devices", str(devices),
            "--precision", precision, "--workdir", str(directory), "--report", report_prefix,
        ]  # fmt: skip
        returncode, output = _run(command, timeout)
        report = CheckReport(strategy, accelerator, devices, precision, returncode=returncode, output=output)
        for rank_file in sorted(directory.glob("report.rank*.json")):
            rank = rank_file.name.removeprefix("report.rank").removesuffix(".json")
            for result in json.loads(rank_file.read_text()):
                if devices > 1:
                    result["check"] = f"{result['check']} [rank {rank}]"
                report.results.append(result)
        return report


def _run(command: list[str], timeout: float) -> tuple[int, str]:
    # A new session, so a timeout can end the launched ranks along with the first one.
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return -1, output + f"\n(timed out after {timeout:.0f} s; all ranks were killed)"
    return process.returncode, output
