"""The Hugging Face Llama benchmark for every configuration, repeated, and the page of its results.

    python -m tools.benchmark.hugging_face_suite run --size 8b --devices 4 --repeats 3 --out results
    python -m tools.benchmark.hugging_face_suite page results/hugging-face-8b.jsonl --out results/hugging-face-8b.md
    python -m tools.benchmark.hugging_face_suite curves results/curves.jsonl --out results/curves.png

``run`` runs every configuration (``--only`` picks some) once a round for ``--repeats`` rounds, so that a drift of
the machine (clocks, temperature, page cache) touches each alike. Each run is a fresh launch of
``tools.benchmark.hugging_face`` with a time limit (``--timeout``): its console goes to ``OUT/logs``, its record is
appended to ``OUT/hugging-face-SIZE.jsonl`` as it ends, and a run that fails or runs out of time is noted in
``OUT/failures.jsonl``, so a session cut short keeps what it measured. ``page`` turns records into a table (median
tokens/s, lowest to highest, MFU, set-up seconds, GPU and host peaks) and a plot of tokens/s beside it. ``curves``
takes records of runs on text (``hugging_face --text``) and prints a table of each run's mean loss over its second
and last tenth of the steps, with a plot of the loss curves.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.benchmark import report

BF16_REDUCE = json.dumps({"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}})
# Label -> the benchmark's arguments. Without the key-value cache throughout: compiled layers need it off, and the
# eager runs are then the baseline they are compared with.
CONFIGURATIONS = {
    "fsdp": ["--strategy", "fsdp", "--no-cache"],
    "fsdp, bf16 reduce": ["--strategy", "fsdp", "--no-cache", "--options", BF16_REDUCE],
    "fsdp compiled": ["--strategy", "fsdp", "--compile"],
    "fsdp compiled, bf16 reduce": ["--strategy", "fsdp", "--compile", "--options", BF16_REDUCE],
    "fsdp compiled, float8": ["--strategy", "fsdp", "--compile", "--float8", "tensorwise"],
    "fsdp compiled, float8 gathers": ["--strategy", "fsdp", "--compile", "--float8", "all-gather"],
    "lightning:fsdp": ["--strategy", "lightning:fsdp", "--no-cache"],
    "lightning:fsdp compiled": ["--strategy", "lightning:fsdp", "--compile"],
    "deepspeed_stage_3": ["--strategy", "deepspeed_stage_3", "--no-cache"],
    "lightning:deepspeed_stage_3": ["--strategy", "lightning:deepspeed_stage_3", "--no-cache"],
    "colossalai_cuda": ["--strategy", "colossalai_cuda", "--no-cache"],
}


FLOAT8_WORDS = {"tensorwise": ", float8", "all-gather": ", float8 gathers"}


def label(record: dict[str, Any]) -> str:
    """A record's configuration in the words of CONFIGURATIONS, read from what it says it ran."""
    words = [record["strategy"]]
    if record.get("compiled_layers"):
        words.append("compiled")
    elif record.get("use_cache"):
        words.append("with cache")
    text = " ".join(words) + FLOAT8_WORDS.get(record.get("float8") or "", "")
    options = record.get("options") or {}
    if options == json.loads(BF16_REDUCE):
        return f"{text}, bf16 reduce"
    return f"{text}, {json.dumps(options, sort_keys=True)}" if options else text


def run(arguments: argparse.Namespace) -> None:
    out = Path(arguments.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    records = out / f"hugging-face-{arguments.size}.jsonl"
    chosen = [name.strip() for name in arguments.only.split(";")] if arguments.only else list(CONFIGURATIONS)
    unknown = [name for name in chosen if name not in CONFIGURATIONS]
    if unknown:
        sys.exit(f"--only names {unknown}, which are not configurations: pick from {'; '.join(CONFIGURATIONS)}")
    common = [
        "--size", arguments.size, "--devices", str(arguments.devices), "--accelerator", arguments.accelerator,
        "--precision", arguments.precision, "--batch", str(arguments.batch), "--length", str(arguments.length),
        "--steps", str(arguments.steps), "--out", str(records),
    ]  # fmt: skip
    for round_ in range(1, arguments.repeats + 1):
        for name in chosen:
            log = logs / f"{name.replace(' ', '-').replace(',', '')}-{round_}.log"
            command = [sys.executable, "-m", "tools.benchmark.hugging_face", *common, *CONFIGURATIONS[name]]
            started = time.perf_counter()
            code = _launch(command, log, arguments.timeout)
            print(f"{name}, round {round_}: exit {code} in {time.perf_counter() - started:.0f} s ({log})", flush=True)
            if code != 0:
                failure = {"configuration": name, "round": round_, "exit": code, "log": str(log)}
                with open(out / "failures.jsonl", "a") as handle:
                    handle.write(json.dumps(failure) + "\n")


def _launch(command: list[str], log: Path, timeout: float) -> int:
    """Run ``command`` in a session of its own, so that a timeout also ends the ranks Lightning started from it."""
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return -int(signal.SIGKILL)


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration, device count and size, in the order first met."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((label(record), record["devices"], record["size"]), []).append(record)
    result = []
    for (name, devices, size), group in groups.items():
        speeds = [record["tokens_per_second"] for record in group if record.get("tokens_per_second")]
        mfus = [record["mfu"] for record in group if record.get("mfu") is not None]
        result.append({
            "configuration": name, "devices": devices, "size": size, "runs": len(speeds),
            "median": statistics.median(speeds) if speeds else None, "lowest": min(speeds, default=None),
            "highest": max(speeds, default=None), "mfu": statistics.median(mfus) if mfus else None,
            "setup_seconds": statistics.median(record["setup_seconds"] for record in group),
            "gpu_reserved_gib": max(record["peak_gpu_reserved_gib"] for record in group),
            "rank_host_gib": max(record["peak_rank_rss_gib"] for record in group),
        })  # fmt: skip
    return result


def page(paths: list[Path], out: Path) -> str:
    """The markdown page of the records in ``paths``, written to ``out`` with its plot beside it; returned too."""
    records = report.read_jsonl(paths)
    if not records:
        raise SystemExit(f"No records in {', '.join(map(str, paths))}: nothing was measured.")
    first = records[0]
    versions = report.versions_line(first["versions"])
    lines = [
        f"# Hugging Face Llama {first['size']}: tokens/s by configuration",
        "",
        f"{first['device']} x {first['device_count']}, CUDA {first['cuda']}, driver {first['driver']}, Python "
        f"{first['python']}; {versions}. {first['precision']}, {first['tokens_per_step'] // first['devices']} tokens "
        f"per GPU and step, {first['steps']} steps (timed from the fourth). Dates: "
        f"{', '.join(sorted({record['date'] for record in records}))}; commits: "
        f"{', '.join(sorted({record['git_commit'] or 'unknown' for record in records}))}. MFU against the dense "
        "16-bit peak.",
        "",
        "| configuration | GPUs | runs | tokens/s (median) | lowest to highest | MFU | seconds to the first step "
        "| GPU reserved | largest process's host memory |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    table = rows(records)
    for row in table:
        median, lowest, highest, mfu = row["median"], row["lowest"], row["highest"], row["mfu"]
        speed = f"{median:,.0f} | {lowest:,} to {highest:,}" if median is not None else "not timed | "
        lines.append(
            f"| {row['configuration']} | {row['devices']} | {row['runs']} | {speed} | "
            f"{f'{100 * mfu:.1f}%' if mfu is not None else ''} | {row['setup_seconds']:.1f} | "
            f"{row['gpu_reserved_gib']} GiB | {row['rank_host_gib']} GiB |"
        )
    failures = paths[0].parent / "failures.jsonl"  # beside the records, where `run` notes them
    if failures.exists():
        lines += ["", "Runs that did not finish:", ""]
        for line in failures.read_text().splitlines():
            failure = json.loads(line)
            lines.append(f"- {failure['configuration']}, round {failure['round']}: exit {failure['exit']}")
    plot = _plot(table, out.with_suffix(".png"))
    lines += ["", f"![tokens/s by configuration]({plot.name})", ""]
    text = "\n".join(lines)
    out.write_text(text)
    return text


def _plot(table: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [row for row in table if row["median"] is not None]
    figure, axes = plt.subplots(figsize=(8, 0.5 * len(measured) + 1.2))
    names = [f"{row['configuration']} ({row['devices']} GPUs)" for row in measured]
    medians = [row["median"] for row in measured]
    errors = [[row["median"] - row["lowest"] for row in measured], [row["highest"] - row["median"] for row in measured]]
    axes.barh(names, medians, xerr=errors, capsize=3)
    axes.invert_yaxis()
    axes.set_xlabel("tokens/s (median; bars from lowest to highest)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def curve_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run on text: its speed and its mean loss over the second and the last tenth of its steps (the first
    tenth falls from the initial loss too fast to compare)."""
    result = []
    for record in records:
        losses, tenth = record["losses"], max(1, len(record["losses"]) // 10)
        result.append({
            "size": record["size"], "devices": record["devices"], "matmuls": _matmuls(record), "seed": record["seed"],
            "steps": len(losses), "tokens_per_second": record["tokens_per_second"], "mfu": record["mfu"],
            "early_loss": round(statistics.fmean(losses[tenth : 2 * tenth] or losses[:1]), 3),
            "final_loss": round(statistics.fmean(losses[-tenth:]), 3),
        })  # fmt: skip
    return result


def _matmuls(record: dict[str, Any]) -> str:
    return f"float8 ({record['float8']})" if record.get("float8") else "bf16"


def curves(paths: list[Path], out: Path) -> str:
    """The table of ``curve_rows`` in markdown, and the loss curves plotted to ``out``."""
    records = report.read_jsonl(paths)
    records = [record for record in records if record.get("losses")]
    if not records:
        raise SystemExit(f"No records of runs on text in {', '.join(map(str, paths))}: run hugging_face --text.")
    lines = [
        "| size | GPUs | matmuls | seed | steps | tokens/s | MFU | mean loss, second tenth | mean loss, last tenth |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in sorted(curve_rows(records), key=lambda row: (row["size"], row["seed"], row["matmuls"])):
        speed = f"{row['tokens_per_second']:,}" if row["tokens_per_second"] else ""  # untimed under four steps
        mfu = f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else ""
        lines.append(
            f"| {row['size']} | {row['devices']} | {row['matmuls']} | {row['seed']} | {row['steps']} | "
            f"{speed} | {mfu} | {row['early_loss']} | {row['final_loss']} |"
        )
    _plot_curves(records, out)
    return "\n".join(lines)


def _plot_curves(records: list[dict[str, Any]], path: Path, smoothing: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(record["size"] for record in records))
    figure, panels = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for panel, size in zip(panels[0], sizes, strict=True):
        for record in (record for record in records if record["size"] == size):
            losses = record["losses"]
            smoothed = [statistics.fmean(losses[max(0, i - smoothing + 1) : i + 1]) for i in range(len(losses))]
            style = "--" if record.get("float8") else "-"
            label = f"{_matmuls(record)}, seed {record['seed']}"
            panel.plot(range(1, len(losses) + 1), smoothed, style, label=label)
        devices = sorted({record["devices"] for record in records if record["size"] == size})
        panel.set_title(f"Llama {size}, {' or '.join(map(str, devices))} GPUs")
        panel.set_xlabel("step")
        panel.set_ylabel(f"loss (mean of the last {smoothing} steps)")
        panel.set_ylim(top=5)
        panel.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="run the configurations, --repeats rounds")
    runner.add_argument("--size", default="8b")
    runner.add_argument("--devices", type=int, default=4)
    runner.add_argument("--accelerator", default="cuda")
    runner.add_argument("--precision", default="bf16-mixed")
    runner.add_argument("--batch", type=int, default=4)
    runner.add_argument("--length", type=int, default=2048)
    runner.add_argument("--steps", type=int, default=10)
    runner.add_argument("--repeats", type=int, default=3)
    runner.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    runner.add_argument("--only", help=f"configurations, separated by ';', of: {'; '.join(CONFIGURATIONS)}")
    runner.add_argument("--out", required=True, help="a folder for the records, failures and logs")
    writer = commands.add_parser("page", help="write the page of records")
    writer.add_argument("records", nargs="+", type=Path)
    writer.add_argument("--out", type=Path, required=True, help="the page's file (.md); the plot goes beside it")
    curve_writer = commands.add_parser("curves", help="tabulate and plot the loss curves of runs on text")
    curve_writer.add_argument("records", nargs="+", type=Path)
    curve_writer.add_argument("--out", type=Path, required=True, help="the plot's file (.png)")
    arguments = parser.parse_args(argv)
    if arguments.command == "run":
        run(arguments)
    elif arguments.command == "curves":
        print(curves(arguments.records, arguments.out))
    else:
        print(page(arguments.records, arguments.out))


if __name__ == "__main__":
    main()
