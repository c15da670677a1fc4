"""Turns the measured results in docs/results/ into one page of every record's tables and plots (the source that
docs/benchmarks.md, the users' summary, is kept from).

Only numbers present in the result files are written. Runs here, on CPU, with matplotlib (no torch).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tools.benchmark import repeats

GIB = 2**30
DIRTY = "-dirty"  # what tools.benchmark.environment.git_commit appends for a modified working tree
PLOT_COLOURS = {"hand": "#7f7f7f", "trainer": "#1f77b4", "lightning": "#ff7f0e"}
KIND_NAMES = {"hand": "by hand", "trainer": "Trainer(strategy=NAME), our package", "lightning": "Lightning built-in"}

ABOUT = """\
What each strategy costs, measured by `tools/benchmark` on a GPU machine. Every run trains the
same GPT-style decoder (pre-norm blocks, fused q/k/v projection, causal
`scaled_dot_product_attention`, GELU MLP 4x wide, vocabulary 50304, learned positions, untied head)
on random tokens, in a fresh process, for the warm-up steps and then the timed steps.

- **Run ids**: `trainer:NAME` is `Trainer(strategy="NAME")` with this project's package;
  `lightning:NAME` is Lightning 2.6's own strategy class built directly; `hand:NAME` is the
  backend driven without Lightning with the same configuration. "vs by hand" divides a run's
  tokens/s by those of its by-hand partner in the same session.
- **tokens/s**: tokens of all devices in the timed steps over their wall time (the device is
  synchronised at the end of warm-up and at the end).
- **MFU**: (6 N + 12 L d s) x tokens/s / (devices x peak), with N the parameters in matrix
  multiplications (blocks and head), L layers, d width, s sequence length; peak is the device's
  dense bf16 tensor-core rate (H100 SXM and H200: 989 TFLOP/s). Blank for unknown devices.
- **Memory**: `torch.cuda.max_memory_allocated` / `max_memory_reserved` and the host's peak
  resident set (VmHWM), the largest over the run's processes.
- **A realistic Trainer run**: the LightningModule logs its loss every step with
  `self.log("loss", loss, prog_bar=True)`, the progress bar is on, a CSV logger writes every step,
  and `ModelCheckpoint` saves a checkpoint when the epoch (the last step) ends. By-hand runs save
  the same state after their last step (torch.save, torch.distributed.checkpoint for FSDP2,
  `engine.save_checkpoint`, Booster's `save_model`/`save_optimizer`). tokens/s covers the timed
  steps; "checkpoint (s)" is the save after them, and "steps + checkpoint" divides the same tokens
  by the timed steps plus the save.
- **Repeats**: each run is measured several times (3; ColossalAI Gemini 5), round by round
  (by hand, ours, built-in, by hand, ...), so a drift of the machine touches every run alike.
  Medians, the spread (highest - lowest) / lowest, and ratios of medians: "vs by hand" against
  the partner, "vs built-in" against Lightning's own strategy of the same name. A spread over 5%
  is marked "not steady". "longest step / median" is the slowest timed step (host-side time) over
  the median one: near 1 for even steps, large when one step stalled.

The drop-in comparison (issue #16 item 4: each strategy through the Trainer at 0.97 or more of the
backend by hand, and at or above Lightning's built-in) is `bash tools/benchmark/dropin.sh` on one
GPU: GPT 1.3B, bf16, 8 x 1024 tokens, 4 warm-up + 10 timed steps, fsdp, deepspeed_stage_2 and
colossalai_cuda, each with its partners, all in one session.

Where each stands (one H200, Python 3.12, torch 2.11, Lightning 2.6.6, DeepSpeed 0.19.8, ColossalAI 0.5.0;
ratios of medians, spreads over every run of one call). deepspeed_stage_2 and colossalai_cuda are measured at 16
sequences a step: at 8 both are bound by the host, and one call's runs spread 11 to 12% (deepspeed_stage_2) and
12 to 26% (ColossalAI), by hand as through the Trainer (below).
colossalai_cuda's five-round calls save no checkpoint, so that five rounds fit one call (its save takes 70 to 118
s); a two-round call with a save in every run gave 0.99. fsdp's and deepspeed_stage_2's save in every run.

| strategy | sequences | by hand | through the Trainer | built-in | vs by hand | vs built-in |
| --- | ---: | --- | --- | --- | ---: | ---: |
| fsdp | 8 | 52,428 to 52,539 (0.2%) | 51,666 to 52,238 (1.1%) | 50,336 to 50,699 (0.7%) | 0.99 | 1.03 |
| deepspeed_stage_2 | 16 | 49,975 to 50,798 (1.6%) | 49,312 to 50,063 (1.5%) | 48,642 to 49,862 (2.5%) | 0.98 | 1.00 |
| 9th, no save | 16 | 48,623 to 50,988 (4.9%) | 48,433 to 49,363 (1.9%) | 48,796 to 50,176 (2.8%) | 1.00 | 0.99 |
| colossalai_cuda | 16 | 55,494 to 56,753 (2.3%) | 56,199 to 56,812 (1.1%) | none | 1.01 | |
| 10th, saving, 2 rounds | 16 | 56,027 to 56,071 (0.1%) | 55,180 to 56,013 (1.5%) | none | 0.99 | |

Sessions below: `2026-11-23-h200-dropin-fsdp-repeats-1x`, `-ds2-mb16-1x`, `-colossalai-mb16-carried-1x`,
`2026-11-24-h200-dropin-ds2-mb16-ckpt-1x` and `-colossalai-mb16-ckpt-1x`. deepspeed_stage_2 against the
built-in: 0.99 in the ninth session and 1.00 in the tenth (three rounds with a checkpoint in every run; the
built-in's third run did not fit the call), each a difference of under 1% between medians whose runs overlap, so
within the spread either way.

**ColossalAI's spread.** Five Trainer runs of colossalai_cuda (1.3B, one H200) once gave 21,339 to
47,090 tokens/s. Measured again on 2026-11-23 (commit 34dfa0e, one H200, no checkpoint so that five rounds
fit one call): by hand 42,096 to 50,734 tokens/s (20.5% apart), through the Trainer 39,386 to 47,108 (19.6%);
medians 45,988 and 44,121, so the Trainer at 0.96 of by hand. What the records rule out and show:

- **Not Lightning's**: Gemini driven by hand spreads as much as through the Trainer.
- **Not the allocator, not the collector**: no cudaMalloc, cudaFree or allocation retry in any timed step
  (the caching allocator had every block after warm-up), and at most 0.01 s of garbage collection.
- **Not a stall**: a slow run is slow in every step (host-side step times of 0.19 to 0.23 s against 0.16 s in a
  fast one; longest step at most 1.3 x the median).
- **Not the GPU clock**: the fastest run ended at 1,695 MHz, slower ones at 1,965.
- Left, a hypothesis: the host. Each Gemini step runs per-parameter Python hooks and synchronises (overflow
  checks), so a step's time may follow the CPU the process runs on. The host's load when timing started (0.6 to
  2.1) does not settle it: by hand the fastest run had the lowest load, through the Trainer the fastest had a
  middling one.
- **Pinned to cores, tighter but not within 5%** (sixth session, commit f625960, the same call under
  `taskset -c 0-7`): by hand 43,233 to 50,226 tokens/s (16.2%), through the Trainer 45,637 to 49,160 (7.7%);
  four of five by hand within 1.9% of each other (49,298 to 50,226), and the last round the slowest both ways.
  Medians 49,467 and 48,271: the Trainer at **0.98** of by hand, and both above the unpinned medians (45,988
  and 44,121). So the host's scheduling is part of the spread, not all of it: what slows the last round is not
  found. Within 5% over five runs is not met, for ColossalAI by hand either.
- **The cause: at 8 sequences a step the GPU waits on the host** (eighth session, commit fa7133c, one H200,
  unpinned, no checkpoint). Five Trainer runs with **16** sequences a step: 56,105 to 56,593 tokens/s, **0.9%
  apart** (MFU 48%). With 8, in the same call: by hand 25.6% apart and the Trainer 22.3% (tables only: the
  per-run records did not come back from the machine), and in a second call by hand 45,918 to 51,367 (11.9%),
  the Trainer 44,652 to 50,760 (13.7%), medians 47,602 and 48,852 (the Trainer at 1.03 of by hand). At 16
  sequences a step takes 0.29 s, 18 ms a sequence; had the GPU been the bound at 8, a step would take about
  0.145 s and give about 56,000 tokens/s. It took 0.155 to 0.19 s: for part of each step the GPU waited for
  work from the host (Gemini's per-parameter hooks and chunk bookkeeping, the same for 8 sequences as for 16),
  and that part follows how fast the host runs the same Python, which varies between runs on this shared
  virtual machine. Consistent with that, not proof of it: the slowest Trainer run's training thread used 1.12 CPU
  seconds over the timed steps against 0.87 to 0.96 in the others, with 1 to 4 involuntary context switches in
  every run (so no core was taken away).
  With 16 sequences the GPU's queue stays ahead of the host, and the host's speed no longer shows. Each run
  now records its training thread's and its process's CPU seconds and context switches (`main_thread_busy`,
  the thread's CPU seconds over the timed wall time: 0.46 to 0.61 here). The process's CPU seconds equal the
  wall time in every run, fast or slow, at 8 or 16 sequences: a thread spins while it waits, so CPU seconds do
  not tell host work from waiting.
- **At 16 sequences by hand and through the Trainer, five rounds** (ninth session, two calls on one H200, no
  checkpoint): with the kernels carried, by hand 55,494 to 56,753 tokens/s (2.3%), the Trainer 56,199 to 56,812
  (1.1%), the Trainer at **1.01** of by hand. On a fresh machine the Trainer gave 55,608 to 55,898 (0.5%) and by
  hand 52,828 to 55,845 in rounds 2 to 5; round 1 by hand, the run that compiled ColossalAI's two kernels just
  before its steps (35 and 54 s by its log; set-up 117 s against 21 to 24), gave 31,742 with steps of 0.29 to
  0.73 s. Why a run is slow right after a compile is not found; it did not recur in the one call that carried the
  kernels (tools/gpu/setup.sh).

With the realistic checkpoint at the end (the session before, 2 rounds of 5 in the time), the Trainer's save
took 114 to 120 s against 82 to 86 s by hand. Most of that is what is saved (`checkpoint_bytes` in the records):
the Trainer's full checkpoint holds the fp32 master weights, so that a resume continues bit for bit (the GPU
tier checks it), 17.0 GB; by hand `booster.save_model` writes Gemini's 16-bit copy, 14.2 GB. At the by-hand rate
(168 MB/s) the larger file would take about 101 s. The rest, 145 against 168 MB/s, is not isolated. By hand,
pinned as ColossalAI's default and unpinned as the strategy's default (`hand:gemini_cuda@unpinned`, ninth
session, two rounds, 16 sequences), saved 14.2 GB in 75.2 and 82.7 s pinned, 76.9 and 78.1 s unpinned, and
trained at 56,848 to 57,011 and 57,414 to 57,482 tokens/s, with 17.1 and 1.7 GiB of host memory at the peak:
pinning (with the asynchronous reduction that comes with it) did not change the save time in two runs each,
and the strategy's unpinned default costs this placement nothing in speed and saves 15 GiB of host memory.
No pinned Trainer save was measured. Both write far below fsdp's rate on the same
machine (17.0 GB in 15 to 21 s, each rank's shards through torch.distributed.checkpoint).

Reproduce on a GPU machine (see tools/benchmark/README.md), then `python -m tools.benchmark report`.
"""


def read_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The records of JSON-lines files, one per non-empty line, in order."""
    return [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]


def load_sessions(results: Path) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    sessions = []
    for summary_path in sorted(results.glob("*.summary.json")):
        summary = json.loads(summary_path.read_text())
        records = results / summary["results_file"]
        if not records.is_file():
            raise SystemExit(
                f"{summary_path} names its records {records.name}, which is not in {results}: copy the .jsonl of "
                "that session beside it, or set its results_file to the name the records were copied under."
            )
        sessions.append((summary, read_jsonl([records])))
    # Newest first.
    sessions.sort(key=lambda session: session[0].get("started", ""), reverse=True)
    return sessions


def write(results: Path, page: Path) -> str:
    sessions = load_sessions(results) if results.is_dir() else []
    parts = ["# Benchmarks\n", ABOUT]
    if not sessions:
        parts.append("\n**No results have been measured yet**: docs/results/ holds no result files.\n")
    if sessions:
        parts.append(spread_section(sessions))
    spread = one_device_spread(sessions)
    for summary, records in sessions:
        parts.append(session_section(summary, records, results, page.parent, spread))
    page.write_text("\n".join(parts))
    from tools.benchmark import memory_plots

    plotted = memory_plots.write(results) if results.is_dir() else []
    return f"wrote {page} from {len(sessions)} result file(s), and {len(plotted)} plot(s) for which-strategy.md"


def session_title(summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """What was measured, where and when: the session's label is an internal name."""
    names = list(dict.fromkeys(r["run"].split(":", 1)[1] for r in records if r["kind"] == "trainer"))
    devices = " and ".join(str(count) for count in summary.get("settings", {}).get("devices") or [])
    title = f"{', '.join(names) or 'baselines'} on {devices or summary.get('device_count')} x {summary.get('device')}"
    if summary.get("scaling"):
        title += ", scaling"
    return f"{title}, {summary.get('date')}"


Key = tuple[str, str, int, str, str]


def run_key(summary: dict[str, Any], record: dict[str, Any]) -> Key:
    """Records with the same key ran the same program on the same kind of device."""
    workload = f"{record['batch_size']}x{record['length']}, {record['warmup_steps']}+{record['timed_steps']} steps"
    return record["run"], record["size"], record["devices"], record["precision"], f"{summary.get('device')} {workload}"


def measured_by_key(sessions: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> dict[Key, list[float]]:
    found: dict[Key, list[float]] = {}
    for summary, records in sessions:
        for record in records:
            if record["status"] == "ok":
                found.setdefault(run_key(summary, record), []).append(record["tokens_per_second"])
    return found


def spread_section(sessions: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> str:
    repeated = {key: values for key, values in measured_by_key(sessions).items() if len(values) > 1}
    if not repeated:
        return ("\n**No run was measured twice**: the run-to-run spread is not known, so small differences are "
                "not findings.\n")  # fmt: skip
    lines = ["\n## Run-to-run spread\n",
             "The same run measured more than once, as repeats of one session or in several sessions (each",
             "session below names its commit). A speed-up or a \"vs by hand\" ratio that lies within this",
             "run-to-run spread is not a measured difference.\n",
             "| run | size | devices | precision | measurements | tokens/s, lowest to highest | spread |",
             "| --- | --- | ---: | --- | ---: | --- | ---: |"]  # fmt: skip
    for (run, size, devices, precision, _), values in sorted(repeated.items()):
        low, high = min(values), max(values)
        lines.append(f"| `{run}` | {size} | {devices} | {precision} | {len(values)} | {low:,.0f} to {high:,.0f} "
                     f"| {100 * (high - low) / low:.0f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def one_device_spread(sessions: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> dict[Key, list[float]]:
    return {key: values for key, values in measured_by_key(sessions).items() if key[2] == 1}


def session_section(
    summary: dict[str, Any], records: list[dict[str, Any]], results: Path, docs: Path, spread: dict[Key, list[float]]
) -> str:
    label = summary["label"]
    lines = [f"\n## {session_title(summary, records)}\n", f"Session `{label}` (docs/results/{label}.jsonl).\n"]
    if not summary.get("complete"):
        lines.append("**Incomplete**: the session ended before its last run; the runs below are those that finished.\n")
    lines += environment_table(summary)
    measured = [record for record in records if record["status"] == "ok"]
    rows = summary.get("repeated") or []
    if any(row["repeats"] > 1 for row in rows):
        lines += ["Each run measured several times, interleaved round by round; ratios are of medians.\n",
                  *repeats.table(rows), "", "Every measurement:\n"]  # fmt: skip
    if records and not summary.get("search"):
        lines += results_table(records)
    if summary.get("search"):
        lines += search_section(summary["search"], records)
    if summary.get("scaling"):
        ok = [record for record in records if record["status"] == "ok"]
        lines += scaling_table(summary["scaling"], summary, ok, spread)
    problems = [record for record in records if record["status"] != "ok"]
    if problems:
        lines.append("\nNot measured:\n")
        for record in problems:
            if record["status"] == "skipped":
                lines.append(
                    f"- `{record['run']}` ({record['size']}, {record['devices']} device(s)): skipped, "
                    f"{record['skip_reason']}"
                )
            else:
                failure = record["failure"]
                lines.append(
                    f"- `{record['run']}` ({record['size']}, {record['devices']} device(s)): failed, "
                    f"{failure['reason']}: {last_line(failure.get('message', ''))}"
                )
    if measured and not summary.get("search"):
        for plot in plots(label, session_title(summary, records), measured, results):
            lines.append(f"\n![{plot.stem}]({Path(os.path.relpath(plot, docs)).as_posix()})")
    return "\n".join(lines) + "\n"


def versions_line(versions: dict[str, str | None]) -> str:
    """The installed versions a record names, as one line ("torch 2.11.0, lightning 2.6.6, ..."); missing ones left
    out."""
    return ", ".join(f"{name} {version}" for name, version in versions.items() if version)


def environment_table(summary: dict[str, Any]) -> list[str]:
    versions = summary.get("versions", {})
    settings = summary.get("settings", {})
    rows = [
        ("device", f"{summary.get('device_count', 0)} x {summary.get('device') or 'no GPU'}"),
        ("driver / CUDA", f"{summary.get('driver')} / {summary.get('cuda')}"),
        ("date", summary.get("date")),
        ("git commit", describe_commit(summary.get("git_commit"))),
        ("python", summary.get("python")),
        *((name, version) for name, version in versions.items() if version),
        ("workload", f"{settings.get('batch_size')} x {settings.get('length')} tokens per device and step, "
                     f"{settings.get('warmup_steps')} warm-up + {settings.get('timed_steps')} timed steps"),
    ]  # fmt: skip
    return ["| | |", "| --- | --- |", *(f"| {name} | {value} |" for name, value in rows), ""]


def results_table(records: list[dict[str, Any]]) -> list[str]:
    # Each measurement against its partner of the same round: runs are interleaved round by round.
    by_key = {(r["run"], r["size"], r["devices"], r.get("repeat")): r for r in records if r["status"] == "ok"}
    lines = [
        "| run | size | devices | precision | tokens/s | vs by hand | MFU | peak GPU allocated (GiB) "
        "| peak GPU reserved (GiB) | peak host RSS (GiB) | final loss | setup (s) |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for record in records:
        if record["status"] != "ok":
            continue
        partner = by_key.get((record.get("partner"), record["size"], record["devices"], record.get("repeat")))
        ratio = f"{record['tokens_per_second'] / partner['tokens_per_second']:.2f}" if partner else ""
        lines.append(
            f"| `{record['run']}` | {record['size']} | {record['devices']} | {record['precision']} "
            f"| {record['tokens_per_second']:,.0f} | {ratio} | {percent(record.get('mfu'))} "
            f"| {gib(record.get('peak_gpu_allocated_bytes'))} | {gib(record.get('peak_gpu_reserved_bytes'))} "
            f"| {gib(record.get('peak_host_rss_bytes'))} | {record['final_loss']:.3f} | {record['setup_seconds']:.0f} |"
        )
    return lines


def search_section(search: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    failure = search.get("first_failure")
    lines = [f"Largest size `{search['run']}` trains on one device: **{search.get('largest_size') or 'none'}**"
             + (f" (next size {failure['size']} failed: {failure['reason']})." if failure else "."), ""]  # fmt: skip
    lines += ["| size | parameters | status | tokens/s | peak GPU allocated (GiB) | peak host RSS (GiB) |",
              "| --- | ---: | --- | ---: | ---: | ---: |"]  # fmt: skip
    for record in records:
        status = record["status"] if record["status"] != "failed" else f"failed ({record['failure']['reason']})"
        ok = record["status"] == "ok"
        tokens = f"{record['tokens_per_second']:,.0f}" if ok else ""
        lines.append(
            f"| {record['size']} | {record['parameters'] / 1e9:.2f}B | {status} | {tokens} "
            f"| {gib(record.get('peak_gpu_allocated_bytes')) if ok else ''} "
            f"| {gib(record.get('peak_host_rss_bytes')) if ok else ''} |"
        )
    return lines


def scaling_table(
    rows: list[dict[str, Any]], summary: dict[str, Any], records: list[dict[str, Any]], spread: dict[Key, list[float]]
) -> list[str]:
    """Speed-ups, with the range the 1-device run's run-to-run spread allows where it was measured twice."""
    lines = ["\nScaling:\n",
             "| run | devices | tokens/s | tokens/s on 1 device | speed-up "
             "| speed-up over the 1-device run-to-run spread |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for row in rows:
        one = next((r for r in records if r["run"] == row["run"] and r["devices"] == 1), None)
        values = spread.get(run_key(summary, one), []) if one else []
        over_spread = (
            f"{row['tokens_per_second'] / max(values):.2f}x to {row['tokens_per_second'] / min(values):.2f}x"
            if len(values) > 1 else "not known (the 1-device run was measured once)"
        )  # fmt: skip
        lines.append(f"| `{row['run']}` | {row['devices']} | {row['tokens_per_second']:,.0f} "
                     f"| {row['tokens_per_second_one_device']:,.0f} | {row['speedup']:.2f}x "
                     f"| {over_spread} |")  # fmt: skip
    return lines


def plots(label: str, title: str, measured: list[dict[str, Any]], results: Path) -> list[Path]:
    """Tokens/s and peak memory per run, coloured by how the backend was driven."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.patches import Patch

    names = [f"{r['run']} ({r['devices']}x, {r['size']})" for r in measured]
    colours = [PLOT_COLOURS[r["kind"]] for r in measured]
    legend = [Patch(color=colour, label=KIND_NAMES[kind]) for kind, colour in PLOT_COLOURS.items()
              if any(r["kind"] == kind for r in measured)]  # fmt: skip
    height = 1.2 + 0.4 * len(measured)
    written = []

    figure, axes = pyplot.subplots(figsize=(9, height))
    axes.barh(names, [r["tokens_per_second"] for r in measured], color=colours)
    axes.invert_yaxis()
    axes.set_xlabel("tokens/s (higher is better)")
    axes.set_title(f"Training throughput: {title}")
    axes.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    written.append(save(figure, results / f"{label}-throughput.png"))

    has_gpu = any(r.get("peak_gpu_allocated_bytes") is not None for r in measured)
    figure, axes = pyplot.subplots(figsize=(9, height))
    positions = range(len(measured))
    if has_gpu:
        axes.barh(
            [p - 0.2 for p in positions],
            [(r.get("peak_gpu_reserved_bytes") or 0) / GIB for r in measured],
            height=0.4,
            color="#c6dbef",
            label="GPU reserved",
        )
        axes.barh(
            [p - 0.2 for p in positions],
            [(r.get("peak_gpu_allocated_bytes") or 0) / GIB for r in measured],
            height=0.4,
            color="#2171b5",
            label="GPU allocated",
        )
    axes.barh([p + 0.2 for p in positions], [r["peak_host_rss_bytes"] / GIB for r in measured], height=0.4,
              color="#fd8d3c", label="host RSS")  # fmt: skip
    axes.set_yticks(list(positions), names)
    axes.invert_yaxis()
    axes.set_xlabel("peak memory (GiB)")
    axes.set_title(f"Peak memory: {title}")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    written.append(save(figure, results / f"{label}-memory.png"))
    return written


def save(figure: Any, path: Path) -> Path:
    from matplotlib import pyplot

    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path


def describe_commit(commit: str | None) -> str:
    if commit and commit.endswith(DIRTY):
        return f"{commit.removesuffix(DIRTY)[:7]} with uncommitted changes"
    return commit or "unknown"


def gib(value: int | None) -> str:
    return "" if value is None else f"{value / GIB:.1f}"


def percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def last_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return f"`{lines[-1][:200]}`" if lines else ""
