"""The plots of docs/which-strategy.md, from the memory-accuracy records in docs/results (matplotlib, no torch):
where each measured configuration kept its memory (GPU per device, host for the node), and tokens/s against
model size for the runs that recorded their speed.

    python -m tools.benchmark report      # writes these beside the benchmark plots
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tools.benchmark.report import DIRTY
from tools.benchmark.sizes import SIZES, parameter_count

COLOURS = {"colossalai": "#2ca02c", "deepspeed": "#d62728", "fsdp": "#1f77b4"}


def measured_configurations(results: Path) -> list[dict[str, Any]]:
    """Every configuration that trained, the newest measurement of each id: by the commit it ran at, in the
    repository's history (records of one day share a date, and file names do not sort by time)."""
    history = commit_history(results)
    trained = [
        record
        for path in sorted(results.glob("*memory-accuracy*.json"))
        for record in json.loads(path.read_text())
        if not record.get("failure") and record.get("gpu_measured_gib") is not None
    ]
    latest: dict[str, dict[str, Any]] = {}
    # Records from before they carried a commit come first; sorted() keeps file order among equals.
    for record in sorted(trained, key=lambda record: position(record.get("git_commit"), history)):
        latest[record["id"]] = record
    return sorted(latest.values(), key=lambda record: (billions(record), record["id"]))


def commit_history(folder: Path) -> list[str]:
    """Full commit hashes, oldest first; empty outside a git checkout or without git."""
    try:
        listing = subprocess.run(["git", "rev-list", "--reverse", "HEAD"], cwd=folder, capture_output=True, text=True)
    except FileNotFoundError:
        return []
    return listing.stdout.split() if listing.returncode == 0 else []


def position(commit: str | None, history: list[str]) -> int:
    """Where a record's commit (abbreviated or full, perhaps marked dirty) lies in ``history``; -1 if unknown."""
    if not commit:
        return -1
    commit = commit.removesuffix(DIRTY)
    return next((index for index, full in enumerate(history) if full.startswith(commit)), -1)


def billions(record: dict[str, Any]) -> float:
    return parameter_count(SIZES[record["size"]], record["length"]) / 1e9


def backend(record: dict[str, Any]) -> str:
    return record["strategy"].split("_", 1)[0]


def label(record: dict[str, Any], size: bool = True) -> str:
    """What a reader needs to tell the configurations apart: size (unless an axis shows it), strategy name,
    offloaded share, GPUs."""
    settings = record.get("settings") or {}
    offloaded = settings.get("offload_optimizer", settings.get("offload_optim_frac"))
    parts = [f"{billions(record):.1f}B {record['strategy']}" if size else record["strategy"]]
    if isinstance(offloaded, float) and 0 < offloaded < 1:
        parts.append(f"{offloaded:.0%} of the optimizer offloaded")
    if (record.get("devices") or 1) > 1:
        parts.append(f"{record['devices']} GPUs")
    if (record.get("accumulate") or 1) > 1:
        parts.append(f"accumulating {record['accumulate']}")
    chosen = {**settings, **(record.get("tuning") or {})}
    if chosen.get("offloaded_gradients_on_gpu"):
        parts.append("gradients accumulating on the GPU")
    elif chosen.get("offloaded_gradients_in_fp32"):
        parts.append("gradients in fp32 on the host")
    if "unpinned" in record.get("note", ""):
        parts.append("host chunks unpinned")
    if record["id"].startswith("h100-"):
        parts.append("H100")
    return ", ".join(parts)


def write(results: Path) -> list[Path]:
    records = measured_configurations(results)
    if not records:
        return []
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    from tools.benchmark.report import save

    names = [label(record) for record in records]
    positions = range(len(records))
    figure, axes = pyplot.subplots(figsize=(11, 1.2 + 0.4 * len(records)))
    axes.barh(
        [p - 0.2 for p in positions],
        [r["gpu_measured_gib"] for r in records],
        height=0.4,
        color="#2171b5",
        label="GPU, per device (max allocated)",
    )
    axes.barh([p + 0.2 for p in positions], [r["host_measured_gib"] for r in records], height=0.4,
              color="#fd8d3c", label="host, all processes (peak resident)")  # fmt: skip
    axes.set_yticks(list(positions), names)
    axes.invert_yaxis()
    axes.set_xlabel("peak memory (GiB) on one H200 unless marked, 128 GiB of host memory")
    axes.set_title("Where each configuration kept its memory")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    written = [save(figure, results / "which-strategy-memory.png")]

    timed = [r for r in records if r.get("speed")]
    if timed:
        figure, axes = pyplot.subplots(figsize=(8, 5))
        for record in timed:
            colour = COLOURS.get(backend(record), "#7f7f7f")
            axes.scatter(billions(record), record["speed"]["tokens_per_second"], color=colour, s=40)
            axes.annotate(label(record, size=False), (billions(record), record["speed"]["tokens_per_second"]),
                          textcoords="offset points", xytext=(6, 4), fontsize=8)  # fmt: skip
        for name, colour in COLOURS.items():
            if any(backend(r) == name for r in timed):
                axes.scatter([], [], color=colour, label=name)
        axes.set_yscale("log")
        axes.set_xlabel("model size (billions of parameters)")
        axes.set_ylabel("tokens/s on one H200 unless marked, log scale")
        axes.set_title("Speed against model size (settings and workloads: docs/which-strategy.md)")
        axes.legend()
        written.append(save(figure, results / "which-strategy-throughput.png"))
    return written
