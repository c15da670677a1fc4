"""The facts a result is only meaningful with: device, driver, CUDA, library versions, date, commit."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = [
    "torch", "lightning", "pytorch-lightning", "deepspeed", "colossalai", "torch_xla", "transformers", "peft",
    "torchao",
    "lightning-strategies", "lightning-strategies-fsdp", "lightning-strategies-deepspeed",
    "lightning-strategies-colossalai-gemini", "lightning-strategies-xla",
]  # fmt: skip

# Run in a child process so this one never creates a CUDA context (it would hold GPU memory that
# the measured processes then lack).
_DEVICE_PROBE = """
import json, torch
from tools.benchmark.measure import peak_bf16_flops
available = torch.cuda.is_available()
name = torch.cuda.get_device_name(0) if available else None
print(json.dumps({"device": name, "device_count": torch.cuda.device_count() if available else 0,
                  "cuda": torch.version.cuda, "peak_bf16_flops": peak_bf16_flops(name) if name else None}))
"""


def collect() -> dict[str, Any]:
    return {
        **device_facts(),
        "driver": driver_version(),
        "python": sys.version.split()[0],
        "versions": versions(),
        "date": datetime.date.today().isoformat(),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "git_commit": git_commit(),
    }


# Settings read from the environment that change set-up or memory, kept with each record.
RECORDED_SETTINGS = ("THP_MEM_ALLOC_ENABLE", "PYTORCH_CUDA_ALLOC_CONF")


def recorded_settings() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in RECORDED_SETTINGS}


def device_facts() -> dict[str, Any]:
    probe = subprocess.run(
        [sys.executable, "-c", _DEVICE_PROBE],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": search_path()},
    )
    if probe.returncode != 0:
        unknown = {"device": None, "device_count": 0, "cuda": None, "peak_bf16_flops": None}
        return {**unknown, "probe_error": probe.stderr[-2000:]}
    return json.loads(probe.stdout.strip().splitlines()[-1])


def search_path() -> str:
    """PYTHONPATH with the repository first, so that child processes import tools.benchmark."""
    return os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))


def driver_version() -> str | None:
    try:
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
    except FileNotFoundError:
        return None
    return query.stdout.strip().splitlines()[0] if query.returncode == 0 and query.stdout.strip() else None


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_commit() -> str | None:
    """BENCHMARK_GIT_COMMIT wins: the GPU machine gets the working tree without .git."""
    if os.environ.get("BENCHMARK_GIT_COMMIT"):
        return os.environ["BENCHMARK_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPOSITORY)
    except FileNotFoundError:
        return None
    if head.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=REPOSITORY)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
