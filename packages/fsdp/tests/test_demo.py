"""The README's demo (tools/demo.py) on this package: quiet about its own model, and a summary at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[3] / "tools" / "demo.py"


def test_the_demo_trains_without_warning_about_its_model_and_ends_with_one_summary_line() -> None:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(DEMO), "--epochs", "2", "--devices", "2"],
        capture_output=True, text=True, timeout=600, env=environment,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "returned a view tensor" not in result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"demo: strategy fsdp on 2 x cpu, (\d+) steps, loss ([\d.]+) -> ([\d.]+), [\d.]+ s", summary)
    assert match, result.stdout
    assert int(match[1]) > 0 and float(match[3]) < float(match[2])
