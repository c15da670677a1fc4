"""One command for the three tables users compare strategies by, and one page of them with plots.

    python -m tools.benchmark.reproduce run --devices 4 --out results         # every part, then the page
    python -m tools.benchmark.reproduce run --parts offload --out results     # one part; the page: all there is
    python -m tools.benchmark.reproduce page results                          # the page again from what is there

The parts, each a command of this harness in a process of its own, 3 rounds by default:

- ``scaling``: GPT 1.3B (tools/benchmark/model.py) through each strategy name, Lightning's built-in and the backend
  by hand, on 1 GPU and on ``--devices``, bf16, 8 x 1024 tokens per GPU and step (``tools.benchmark run --preset
  scaling``);
- ``hugging-face``: a Hugging Face Llama-3 8B from its config on ``--devices`` GPUs, bf16, 4 x 2048 tokens per GPU
  and step, under fsdp, deepspeed_stage_3 and Lightning's two built-ins (``tools.benchmark.hugging_face_suite``);
- ``offload``: GPT 13B on one GPU with the settings ``lightning-strategies plan`` chooses for 128 GiB of host memory,
  through deepspeed_stage_3 and colossalai, the plan's memory predictions beside the measured peaks
  (``tools.benchmark.memory_accuracy``).

A part that fails or runs out of time leaves what it measured and the others still run; ``OUT/parts.jsonl`` says
how each ended. The page, ``OUT/README.md`` with ``scaling.png`` and ``sizes.png`` beside it, gives medians with
the lowest and highest run, MFU against the dense bf16 peak, the machine, versions, dates and commits of the
records, and the commands that made them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tools.benchmark import hugging_face_suite, memory_plots, report

REPOSITORY = Path(__file__).resolve().parents[2]

PARTS = ("scaling", "hugging-face", "offload")
HUGGING_FACE = ("fsdp", "lightning:fsdp", "deepspeed_stage_3", "lightning:deepspeed_stage_3")
OFFLOAD = ("largest-ds3-13b-accumulate-8", "largest-gemini-13b")  # memory_accuracy's ids: 13B, one GPU, planned


def commands(arguments: argparse.Namespace) -> dict[str, list[list[str]]]:
    """Each part's commands, in the order they run (the page lists them as they were given)."""
    out, rounds = Path(arguments.out).resolve(), str(arguments.repeats)
    python = [sys.executable, "-m"]
    scaling = [
        *python, "tools.benchmark", "run", "--preset", "scaling", "--size", arguments.scaling_size,
        "--devices", str(arguments.devices), "--accelerator", arguments.accelerator, "--repeats", rounds,
        "--repeats-gemini", rounds, "--timeout", str(arguments.timeout), "--out", str(out / "scaling"),
        "--label", "scaling", "--logs", str(out / "scaling" / "logs"), *shlex.split(arguments.scaling_args),
    ]  # fmt: skip
    hugging_face = [
        *python, "tools.benchmark.hugging_face_suite", "run", "--size", arguments.hugging_face_size,
        "--devices", str(arguments.devices), "--accelerator", arguments.accelerator, "--repeats", rounds,
        "--timeout", str(arguments.timeout), "--only", ";".join(arguments.hugging_face_only),
        "--out", str(out / "hugging-face"), *shlex.split(arguments.hugging_face_args),
    ]  # fmt: skip
    # memory_accuracy writes its records afresh on each call: a folder per round keeps every round.
    offload = [
        [*python, "tools.benchmark.memory_accuracy", "--only", ",".join(arguments.offload_only), "--steps", "10",
         "--accelerator", arguments.accelerator, "--timeout", str(arguments.timeout),
         "--out", str(out / "offload" / f"round-{round_}"), *shlex.split(arguments.offload_args)]
        for round_ in range(1, arguments.repeats + 1)
    ]  # fmt: skip
    return {"scaling": [scaling], "hugging-face": [hugging_face], "offload": offload}


def run(arguments: argparse.Namespace) -> None:
    out = Path(arguments.out)
    # Each part's harness treats records already there its own way (started afresh, added to, written over): a part
    # is measured into a folder of its own once, so that the page and the commands it lists say what was run.
    measured = [part for part in arguments.parts if (out / part).exists()]
    if measured:
        raise SystemExit(
            f"{', '.join(str(out / part) for part in measured)}: measured by an earlier call. Measure into another "
            "--out, or move those folders away (and their lines of parts.jsonl) to measure them again."
        )
    out.mkdir(parents=True, exist_ok=True)
    planned = commands(arguments)
    for part in arguments.parts:
        for command in planned[part]:
            print(f"{part}: {shlex.join(command)}", flush=True)
            started = time.perf_counter()
            code = subprocess.call(command, cwd=REPOSITORY)  # where `-m tools.benchmark...` is found
            ended = {"part": part, "command": shlex.join(["python", *command[1:]]), "exit": code}
            ended["seconds"] = round(time.perf_counter() - started)
            with open(out / "parts.jsonl", "a") as handle:
                handle.write(json.dumps(ended) + "\n")
    print(page(out))


def _spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _percent(value: float | None) -> str:
    return f"{100 * value:.1f}%" if value is not None else "n/a"


def scaling_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run: on each device count, the median tokens/s (lowest, highest) and MFU of its runs that trained, or why
    none did; and the speed-up of the medians from the fewest GPUs to the most."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for record in records:
        runs.setdefault(record["run"], {}).setdefault(record["devices"], []).append(record)
    rows = []
    for name, by_devices in runs.items():
        first = next(iter(by_devices.values()))[0]
        billions = first["parameters"] / 1e9 if first.get("parameters") else _billions(first["size"])
        row: dict[str, Any] = {"run": name, "billions": billions, "by_devices": {}, "not_measured": {}}
        for devices, group in sorted(by_devices.items()):
            trained = [record for record in group if record.get("status") == "ok" and record.get("tokens_per_second")]
            if not trained:
                row["not_measured"][devices] = _why_not(group[-1])
                continue
            mfus = [record["mfu"] for record in trained if record.get("mfu") is not None]
            row["by_devices"][devices] = {
                "runs": len(trained),
                "tokens_per_second": _spread([record["tokens_per_second"] for record in trained]),
                "mfu": statistics.median(mfus) if mfus else None,
            }
        counts = sorted(row["by_devices"])
        if len(counts) > 1:
            one, most = row["by_devices"][counts[0]], row["by_devices"][counts[-1]]
            row["speedup"] = most["tokens_per_second"][0] / one["tokens_per_second"][0]
        rows.append(row)
    return rows


def _why_not(record: dict[str, Any]) -> str:
    """Why a run has no speed: skipped (its packages or device are missing) or failed, in the harness's words."""
    if record.get("status") == "skipped":
        return f"skipped: {record.get('skip_reason') or 'no reason given'}"
    failure = record.get("failure") or {}
    return f"failed: {failure.get('reason', 'no reason given')}"


def offload_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration: median tokens/s (lowest, highest) and MFU over the rounds, and the widest memory error."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(record["id"], []).append(record)
    rows = []
    for name, group in groups.items():
        timed = [record for record in group if record.get("speed") and record["speed"].get("tokens_per_second")]
        mfus = [record["speed"]["mfu"] for record in timed if record["speed"].get("mfu") is not None]
        errors = [abs(r[key]) for r in group for key in ("gpu_error", "host_error") if r.get(key) is not None]
        rows.append({
            "id": name, "strategy": group[0]["strategy"], "size": group[0]["size"], "runs": len(timed),
            "billions": memory_plots.billions(group[0]),
            "failures": [record["failure"] for record in group if record.get("failure")],
            "tokens_per_second": _spread([r["speed"]["tokens_per_second"] for r in timed]) if timed else None,
            "mfu": statistics.median(mfus) if mfus else None,
            "gpu": (group[0]["gpu_predicted_gib"], _largest(r["gpu_measured_gib"] for r in group)),
            "host": (group[0]["host_predicted_gib"], _largest(r["host_measured_gib"] for r in group)),
            "worst_error": max(errors, default=None),
        })  # fmt: skip
    return rows


def _largest(values: Iterable[float | None]) -> float | None:
    """The largest of the measured values; None where a run that failed measured none."""
    return max((value for value in values if value is not None), default=None)


def _gib(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "n/a"


def _measured_on(dated: list[dict[str, Any]], device: str) -> str:
    """Where and when: ``dated`` are the records (or the summaries of the sessions) that carry date and commit."""
    dates = sorted({entry["date"] for entry in dated if entry.get("date")})
    commits = sorted({entry.get("git_commit") or "unknown" for entry in dated})
    return f"Measured on {device}; dates {', '.join(dates)}; commits {', '.join(commits)}."


def _scaling_section(out: Path) -> tuple[list[str], list[dict[str, Any]]]:
    sessions = report.load_sessions(out / "scaling") if (out / "scaling").is_dir() else []
    summaries = [summary for summary, _ in sessions]
    rows = scaling_rows([record for _, records in sessions for record in records])
    if not rows:
        return ["Not measured (no records in scaling/)."], []
    first = summaries[0]
    counts = sorted({devices for row in rows for devices in (*row["by_devices"], *row["not_measured"])})
    versions = report.versions_line(first["versions"])
    settings = first["settings"]
    machine = f"{first['device_count']} x {first['device']}"
    lines = [
        f"GPT {settings['size']} (tools/benchmark/model.py), bf16-mixed, {settings['batch_size']} x "
        f"{settings['length']} tokens per GPU and step, {settings['warmup_steps'] or 4} warm-up and "
        f"{settings['timed_steps'] or 12} timed steps. {_measured_on(summaries, machine)} {versions}.",
        "",
        "| run | " + " | ".join(f"{count} GPU{'s' if count > 1 else ''}: tokens/s (lowest to highest), MFU"
                                for count in counts) + " | speed-up |",
        "| --- | " + " | ".join("---:" for _ in counts) + " | ---: |",
    ]  # fmt: skip
    for row in rows:
        cells = []
        for count in counts:
            at = row["by_devices"].get(count)
            if at is None:
                cells.append(row["not_measured"].get(count, "not run"))
                continue
            median, lowest, highest = at["tokens_per_second"]
            runs = f"{at['runs']} run{'s' if at['runs'] > 1 else ''}"
            cells.append(f"{median:,.0f} ({lowest:,.0f} to {highest:,.0f}, {runs}), {_percent(at['mfu'])}")
        speedup = f"{row['speedup']:.2f}x" if "speedup" in row else ""
        lines.append(f"| `{row['run']}` | {' | '.join(cells)} | {speedup} |")
    return lines, rows


def _hugging_face_section(out: Path) -> tuple[list[str], list[dict[str, Any]]]:
    paths = sorted((out / "hugging-face").glob("hugging-face-*.jsonl"))
    records = report.read_jsonl(paths)
    if not records:
        return ["Not measured (no records in hugging-face/)."], []
    table = hugging_face_suite.page(paths, out / "hugging-face" / "page.md").splitlines()
    body = [line for line in table[2:] if not line.startswith("![")]  # its title and plot stay on its own page
    while body and not body[-1]:
        body.pop()
    return [*body, "", "Its own page, with its plot: [hugging-face/page.md](hugging-face/page.md)."], records


def _offload_section(out: Path) -> tuple[list[str], list[dict[str, Any]]]:
    records, cut_short = [], []
    for path in sorted((out / "offload").glob("*/memory-accuracy.json")):
        try:
            records += json.loads(path.read_text())
        except ValueError:  # the round was killed while it rewrote the file
            cut_short.append(path.parent.name)
    rows = offload_rows(records)
    if not rows:
        return ["Not measured (no records in offload/)."], []
    first = records[0]
    versions = report.versions_line(first["versions"])
    lines = [
        f"One GPU, the settings `lightning-strategies plan` chooses. {_measured_on(records, first['device'])} "
        f"{versions}.",
        "",
        "| configuration | strategy | runs | tokens/s (lowest to highest) | MFU | GPU peak: planned, measured "
        "| host peak: planned, measured | widest error of the plan |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if row["tokens_per_second"] is None:
            speed = "did not train: " + "; ".join(_last_line(failure) for failure in row["failures"])
        else:
            speed = "{:,.0f} ({:,.0f} to {:,.0f})".format(*row["tokens_per_second"])
        error = _percent(row["worst_error"]) if row["worst_error"] is not None else ""
        lines.append(
            f"| {row['id']} | `{row['strategy']}` | {row['runs']} | {speed} | {_percent(row['mfu'])} | "
            f"{_gib(row['gpu'][0])}, {_gib(row['gpu'][1])} GiB | {_gib(row['host'][0])}, {_gib(row['host'][1])} GiB | "
            f"{error} |"
        )
    if cut_short:
        lines += ["", f"Left out, cut short by a kill as they were written: {', '.join(cut_short)}."]
    return lines, rows


def _last_line(failure: str) -> str:
    """The line of a failure's console that says what ended it, fit for a table cell."""
    lines = [line.strip() for line in failure.splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:160].replace("|", "/")


def page(out: Path) -> str:
    """Write ``out/README.md`` (and its plots) from what the parts left in ``out``; return its text."""
    scaling, scaling_table = _scaling_section(out)
    hugging_face, hugging_face_records = _hugging_face_section(out)
    offload, offload_table = _offload_section(out)
    lines = [
        "# What each strategy reaches: scaling, a Hugging Face 8B, offloading",
        "",
        "Medians over the rounds, with the lowest and highest run; MFU is the model's FLOPs per second over the "
        "GPU's dense bf16 peak (989 TFLOP/s on an H100 SXM or H200).",
        "",
        "## 1.3B on one GPU and on several",
        "",
        *scaling,
        "",
        "## A Hugging Face model",
        "",
        *hugging_face,
        "",
        "## 13B on one GPU, offloading what does not fit",
        "",
        *offload,
        "",
    ]
    plots = _plots(out, scaling_table, hugging_face_records, offload_table)
    lines += [f"![{title}]({path.name})" for title, path in plots] + [""]
    parts = out / "parts.jsonl"
    if parts.exists():
        lines += ["## How they were taken", "", "From the repository root, in this order:", "", "```bash"]
        ended = report.read_jsonl([parts])
        lines += [entry["command"] for entry in ended]
        lines += ["```", ""]
        failed = [entry for entry in ended if entry["exit"] != 0]
        lines += [f"- `{entry['part']}` ended with exit code {entry['exit']} after {entry['seconds']} s: its logs "
                  "are in its folder." for entry in failed]  # fmt: skip
    text = "\n".join(lines)
    (out / "README.md").write_text(text)
    return text


def _plots(
    out: Path, scaling: list[dict[str, Any]], hugging_face: list[dict[str, Any]], offload: list[dict[str, Any]]
) -> list[tuple[str, Path]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = []
    if any(len(row["by_devices"]) > 1 for row in scaling):
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for row in scaling:
            counts = sorted(row["by_devices"])
            if not counts:
                continue
            axes.plot(counts, [row["by_devices"][c]["tokens_per_second"][0] for c in counts], marker="o",
                      label=row["run"])  # fmt: skip
        axes.set_xlabel("GPUs")
        axes.set_ylabel("tokens/s (median)")
        axes.set_xticks(sorted({count for row in scaling for count in row["by_devices"]}))
        axes.legend(fontsize="small")
        plots.append(("tokens/s against GPUs, 1.3B", _save(figure, out / "scaling.png")))
    by_size = _per_gpu_by_size(scaling, hugging_face, offload)
    if by_size:
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for name, points in sorted(by_size.items()):
            points.sort()
            axes.plot([size for size, _ in points], [speed for _, speed in points], marker="o", label=name)
        axes.set_xlabel("parameters (billions; GPT 1.3B and 13B, Llama 8B)")
        axes.set_ylabel("tokens/s per GPU (median)")
        axes.set_yscale("log")  # offloading runs at a tenth of the rest
        axes.legend(fontsize="small")
        plots.append(("tokens/s per GPU against model size", _save(figure, out / "sizes.png")))
    plt.close("all")
    return plots


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def _per_gpu_by_size(
    scaling: list[dict[str, Any]], hugging_face: list[dict[str, Any]], offload: list[dict[str, Any]]
) -> dict[str, list[tuple[float, float]]]:
    """Strategy names (and Lightning's built-ins) -> (billions of parameters, median tokens/s per GPU) on the most
    GPUs each part measured. Runs by hand are left out: they have no name a user selects."""
    points: dict[str, list[tuple[float, float]]] = {}

    def add(name: str, billions: float | None, per_gpu: float) -> None:
        if billions is not None:  # a model named without its size (the CPU tests' "tiny") has no place on the axis
            points.setdefault(name, []).append((billions, per_gpu))

    for row in scaling:
        kind, _, name = row["run"].partition(":")
        if kind != "hand" and row["by_devices"]:
            devices = max(row["by_devices"])
            per_gpu = row["by_devices"][devices]["tokens_per_second"][0] / devices
            add(name if kind == "trainer" else f"lightning:{name}", row["billions"], per_gpu)
    for table_row in hugging_face_suite.rows(hugging_face):
        if table_row["median"] is not None and " " not in table_row["configuration"]:  # no variant (compiled, ...)
            add(table_row["configuration"], _billions(table_row["size"]), table_row["median"] / table_row["devices"])
    for row in offload:
        if row["tokens_per_second"] is not None:
            add(row["strategy"], row["billions"], row["tokens_per_second"][0])
    return points


def _billions(size: str) -> float | None:
    """'1.3b' -> 1.3, '125m' -> 0.125; None for a name without a number ('tiny', the CPU tests' model)."""
    number, unit = size[:-1], size[-1].lower()
    if unit not in "bm" or not number.replace(".", "", 1).isdigit():
        return None
    return float(number) if unit == "b" else float(number) / 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark.reproduce", description=__doc__.splitlines()[0])
    commands_ = parser.add_subparsers(dest="command", required=True)
    runner = commands_.add_parser("run", help="run the parts (on the GPU machine), then write the page")
    runner.add_argument("--out", type=Path, required=True, help="a folder for every part's records, logs and page")
    runner.add_argument("--parts", type=lambda text: text.split(","), default=list(PARTS), help=",".join(PARTS))
    runner.add_argument("--devices", type=int, default=4, help="GPUs of the scaling and Hugging Face parts")
    runner.add_argument("--repeats", type=int, default=3, help="rounds of every configuration")
    runner.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    runner.add_argument("--accelerator", default="cuda", choices=["cuda", "cpu"])
    runner.add_argument("--scaling-size", default="1.3b")
    runner.add_argument("--hugging-face-size", default="8b")
    runner.add_argument("--hugging-face-only", type=lambda text: text.split(";"), default=list(HUGGING_FACE))
    runner.add_argument("--offload-only", type=lambda text: text.split(","), default=list(OFFLOAD))
    for part in ("scaling", "hugging-face", "offload"):
        runner.add_argument(f"--{part}-args", default="", help=f"more arguments for the {part} part's command")
    writer = commands_.add_parser("page", help="write the page from what a run left in the folder")
    writer.add_argument("out", type=Path)
    arguments = parser.parse_args(argv)
    unknown = [part for part in getattr(arguments, "parts", ()) if part not in PARTS]
    if unknown:
        parser.error(f"--parts names {', '.join(unknown)}: pick from {', '.join(PARTS)}")
    if arguments.command == "run":
        run(arguments)
    else:
        print(page(arguments.out))


if __name__ == "__main__":
    main()
