"""Command line of the benchmark harness.

    python -m tools.benchmark run --preset issue                 # the reference comparison, one GPU
    python -m tools.benchmark run --preset dropin --budget 500    # issue #16's drop-in comparison (dropin.sh)
    python -m tools.benchmark run --runs hand:torch,trainer:fsdp --size 350m
    python -m tools.benchmark run --preset scaling --devices 2   # each run on 1 and on 2 GPUs, speed-up
    python -m tools.benchmark run --search-largest deepspeed_stage_3_offload
    python -m tools.benchmark list                               # run ids, presets, what is installed
    python -m tools.benchmark report                             # docs/results/*.json -> benchmark-records.md

``python tools/benchmark/cli.py ...`` is the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tools.benchmark

from tools.benchmark.catalogue import PRESETS, RUNS, VARIANTS, is_gemini, resolve
from tools.benchmark.sizes import SEARCH_ORDER, SIZES

REPOSITORY = Path(__file__).resolve().parents[2]


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m tools.benchmark", description=__doc__.splitlines()[0])
    commands = main.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="measure (on the GPU machine)")
    chosen = run.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--preset", choices=list(PRESETS), help="a named set of runs")
    chosen.add_argument("--runs", help="comma-separated run ids (see `list`)")
    chosen.add_argument("--search-largest", metavar="NAME", help="largest size NAME (a strategy name or run id) trains")
    run.add_argument("--size", default="1.3b", choices=list(SIZES))
    run.add_argument("--search-from", default=SEARCH_ORDER[0], choices=SEARCH_ORDER, help="first size to try")
    run.add_argument("--batch-size", type=int, default=8, help="sequences per device and step")
    run.add_argument("--length", type=int, default=1024, help="tokens per sequence")
    run.add_argument("--warmup-steps", type=int, default=None, help="default 4 (2 for --search-largest)")
    run.add_argument("--timed-steps", type=int, default=None, help="default 12 (8 for --search-largest)")
    run.add_argument("--devices", type=int, default=1, help="N > 1: every run on 1 and on N devices")
    run.add_argument("--accelerator", default="cuda", choices=["cuda", "cpu"])
    run.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "results", help="where results are written")
    run.add_argument("--label", help="file name stem of the results (default: date-device-preset-Nx)")
    run.add_argument("--logs", type=Path, help="one log per run (default: $TMPDIR/benchmark-logs/LABEL)")
    run.add_argument(
        "--timeout", type=float, default=300, help="seconds one run may take, setup and JIT builds included"
    )
    run.add_argument("--repeats", type=int, default=3, help="times each run is measured, interleaved round by round")
    run.add_argument(
        "--repeats-gemini", type=int, default=5, help="times each ColossalAI Gemini run is measured (its speed spreads)"
    )
    run.add_argument(
        "--budget", type=float, help="seconds for the whole session: no run starts that its earlier repeats say "
        "would not end in time, and a run gets at most what is left"
    )  # fmt: skip
    run.add_argument("--checkpoint-dir", type=Path, help="where runs save their checkpoint (default: $TMPDIR)")
    run.add_argument("--no-checkpoint", action="store_true", help="save no checkpoint after the last step")

    commands.add_parser("list", help="run ids, presets and which runs are installed here")

    report = commands.add_parser("report", help="write every record's tables and plots from docs/results into one page")
    report.add_argument("--results", type=Path, default=REPOSITORY / "docs" / "results")
    # docs/benchmarks.md is the users' summary, kept by hand from this page: the report never writes over it.
    report.add_argument("--page", type=Path, default=Path("benchmark-records.md"))
    return main


def command_run(arguments: argparse.Namespace) -> None:
    from tools.benchmark import orchestrate
    from tools.benchmark.measure import Workload

    searching = arguments.search_largest is not None
    warmup = arguments.warmup_steps if arguments.warmup_steps is not None else (2 if searching else 4)
    timed = arguments.timed_steps if arguments.timed_steps is not None else (8 if searching else 12)
    if warmup < 1 or timed < 1:
        raise SystemExit("--warmup-steps and --timed-steps must be at least 1 (timing starts after warm-up).")
    if arguments.repeats < 1 or arguments.repeats_gemini < 1:
        raise SystemExit("--repeats and --repeats-gemini must be at least 1 (one measurement per run).")
    device_counts = [1] if arguments.devices == 1 else [1, arguments.devices]
    base = Workload(
        run="",
        size=arguments.size,
        batch_size=arguments.batch_size,
        length=arguments.length,
        warmup_steps=warmup,
        timed_steps=timed,
        accelerator=arguments.accelerator,
    )
    settings = {
        "preset": arguments.preset,
        "runs": arguments.runs,
        "search_largest": arguments.search_largest,
        "size": arguments.size,
        "batch_size": arguments.batch_size,
        "length": arguments.length,
        "warmup_steps": warmup,
        "timed_steps": timed,
        "devices": device_counts,
        "accelerator": arguments.accelerator,
        "repeats": None if searching else arguments.repeats,
        "repeats_gemini": None if searching else arguments.repeats_gemini,
        "budget_seconds": arguments.budget,
        "checkpoint": not arguments.no_checkpoint,
        "checkpoint_dir": str(arguments.checkpoint_dir) if arguments.checkpoint_dir else None,
    }
    if arguments.checkpoint_dir:
        arguments.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    session = orchestrate.new_session(
        arguments.out,
        arguments.label,
        arguments.logs,
        arguments.timeout,
        settings,
        checkpoint=not arguments.no_checkpoint,
        checkpoint_root=arguments.checkpoint_dir,
        budget=arguments.budget,
    )
    session.start()
    print(f"results: {session.results_path}\nlogs: {session.logs}", flush=True)
    if searching:
        name = arguments.search_largest
        run_id = name if ":" in name else f"trainer:{name}"
        orchestrate.search_largest(session, resolve([run_id])[0], base, arguments.search_from)
        return
    run_ids = PRESETS[arguments.preset] if arguments.preset else [part.strip() for part in arguments.runs.split(",")]
    gemini, other = arguments.repeats_gemini, arguments.repeats
    orchestrate.run_all(session, resolve(run_ids), base, device_counts, lambda run: gemini if is_gemini(run) else other)


def command_list() -> None:
    for run in RUNS.values():
        missing = run.missing()
        state = f"missing {', '.join(missing)}" if missing else "installed"
        print(f"{run.id:38} {state:28} {run.description}")
    for name, run_ids in PRESETS.items():
        print(f"preset {name}: {', '.join(run_ids)}")
    for name, variant in VARIANTS.items():
        print(f"variant @{name}: {variant.description}")


def main(argv: list[str] | None = None) -> None:
    arguments = parser().parse_args(argv)
    if arguments.command == "run":
        command_run(arguments)
    elif arguments.command == "list":
        command_list()
    else:
        from tools.benchmark import report

        print(report.write(arguments.results, arguments.page))


if __name__ == "__main__":
    main()
