"""CPU tests of the benchmark harness: the tiny GPT trained for real (PyTorch, FSDP2 by hand and
Trainer(strategy="fsdp") over gloo, on one and two processes), the realistic Trainer run (loss logged
every step, progress bar, checkpoint at the end), repeats interleaved round by round with their
medians, spreads and ratios, the session budget, failures recorded, the report written.

    python -m pytest tools/benchmark/test_harness.py     (needs torch, lightning and lightning-strategies-fsdp;
                                                          matplotlib for the report test)
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY))

from tools.benchmark import orchestrate, repeats  # noqa: E402
from tools.benchmark.catalogue import PRESETS, RUNS, VARIANTS, resolve  # noqa: E402
from tools.benchmark.measure import classify_failure, peak_bf16_flops  # noqa: E402
from tools.benchmark.model import GPT, training_flops_per_token  # noqa: E402
from tools.benchmark.sizes import SIZES, parameter_count  # noqa: E402

TINY = ["--accelerator", "cpu", "--size", "tiny", "--batch-size", "2", "--length", "32",
        "--warmup-steps", "1", "--timed-steps", "2"]  # fmt: skip
MEASURED_FIELDS = [
    "tokens_per_second", "seconds_per_step", "mfu", "flops_per_token", "final_loss", "losses",
    "peak_gpu_allocated_bytes", "peak_gpu_reserved_bytes", "peak_host_rss_bytes", "setup_seconds", "wall_seconds",
    "parameters", "layers", "width", "heads", "batch_size", "length", "warmup_steps", "timed_steps", "precision",
]  # fmt: skip


def benchmark(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.benchmark", *arguments], cwd=REPOSITORY, capture_output=True, text=True
    )


def read_session(out: Path, label: str) -> tuple[dict, list[dict]]:
    summary = json.loads((out / f"{label}.summary.json").read_text())
    records = [json.loads(line) for line in (out / summary["results_file"]).read_text().splitlines()]
    return summary, records


@pytest.fixture(scope="module")
def cpu_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[dict]]:
    out = tmp_path_factory.mktemp("results")
    # hand:gemini_cuda needs CUDA (and ColossalAI): it must be recorded as skipped, not crash the harness.
    runs = "hand:torch,hand:fsdp,trainer:fsdp,hand:gemini_cuda"
    completed = benchmark("run", "--runs", runs, "--devices", "2", "--out", str(out), "--label", "cpu", *TINY,
                          "--repeats", "1", "--repeats-gemini", "1", "--logs", str(out / "logs"))  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return (out, *read_session(out, "cpu"))


def test_every_run_trains_with_finite_loss_on_one_and_two_processes(cpu_session) -> None:
    _, _, records = cpu_session
    measured = [record for record in records if record["status"] == "ok"]
    assert sorted((r["run"], r["devices"]) for r in measured) == sorted(
        (run, devices) for run in ("hand:torch", "hand:fsdp", "trainer:fsdp") for devices in (1, 2)
    ), [(r["run"], r["devices"], r["status"], r.get("failure")) for r in records]
    for record in measured:
        missing = [field for field in MEASURED_FIELDS if field not in record]
        assert not missing, f"{record['run']} lacks {missing}"
        assert math.isfinite(record["final_loss"]) and len(record["losses"]) == 3
        # Random tokens over 50304 classes: the loss starts near log(50304) = 10.8.
        assert 9.0 < record["losses"][0] < 12.0
        assert record["tokens_per_second"] > 0 and record["peak_host_rss_bytes"] > 0
        assert record["mfu"] is None and record["peak_gpu_allocated_bytes"] is None  # no GPU, no peak to divide by
    trainer = next(r for r in measured if r["run"] == "trainer:fsdp")
    assert trainer["strategy_class"] == "lightning_strategies_fsdp.strategy.FSDP2Strategy"
    assert trainer["partner"] == "hand:fsdp"


def test_runs_that_cannot_run_here_are_recorded_as_skipped(cpu_session) -> None:
    _, _, records = cpu_session
    skipped = [record for record in records if record["run"] == "hand:gemini_cuda"]
    assert [record["status"] for record in skipped] == ["skipped", "skipped"]
    assert all(record["skip_reason"] for record in skipped)


def test_summary_names_the_environment_and_the_speedup(cpu_session) -> None:
    _, summary, _ = cpu_session
    assert summary["complete"] is True
    for field in ("device", "driver", "cuda", "versions", "date", "git_commit", "settings", "python"):
        assert field in summary
    assert summary["versions"]["torch"] and summary["versions"]["lightning"]
    assert summary["counts"] == {"ok": 6, "skipped": 2}
    speedups = {row["run"]: row["speedup"] for row in summary["scaling"]}
    assert set(speedups) == {"hand:torch", "hand:fsdp", "trainer:fsdp"}
    assert all(speedup > 0 for speedup in speedups.values())


def test_report_writes_tables_and_plots_from_the_results(cpu_session, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out, _, records = cpu_session
    page = tmp_path / "benchmarks.md"
    completed = benchmark("report", "--results", str(out), "--page", str(page))
    assert completed.returncode == 0, completed.stderr
    text = page.read_text()
    assert "`trainer:fsdp`" in text and "Scaling:" in text and "skipped" in text
    trainer = next(r for r in records if r["run"] == "trainer:fsdp" and r["devices"] == 1)
    assert f"{trainer['tokens_per_second']:,.0f}" in text
    assert (out / "cpu-throughput.png").stat().st_size > 0 and (out / "cpu-memory.png").stat().st_size > 0


def test_which_strategy_plots_keep_the_newest_measurement_of_each_trained_configuration(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from tools.benchmark import memory_plots

    def record(id_: str, size: str, gpu: float | None, speed: dict | None = None, failure: str | None = None) -> dict:
        return {"id": id_, "strategy": "colossalai", "size": size, "length": 1024, "gpu_measured_gib": gpu,
                "host_measured_gib": 3.0, "speed": speed, "failure": failure}  # fmt: skip

    (tmp_path / "2026-01-01-memory-accuracy.json").write_text(json.dumps([record("a", "1.3b", 30.0)]))
    newer = [record("a", "1.3b", 31.0, {"tokens_per_second": 4e4}), record("b", "125m", None, failure="killed")]
    (tmp_path / "2026-01-02-memory-accuracy.json").write_text(json.dumps(newer))
    kept = memory_plots.measured_configurations(tmp_path)
    assert [(r["id"], r["gpu_measured_gib"]) for r in kept] == [("a", 31.0)]  # the failed one is left out
    written = memory_plots.write(tmp_path)
    assert [path.name for path in written] == ["which-strategy-memory.png", "which-strategy-throughput.png"]
    assert all(path.stat().st_size > 0 for path in written)


def test_which_strategy_plots_take_the_record_of_the_later_commit_whatever_the_file_names(tmp_path: Path) -> None:
    from tools.benchmark import memory_plots

    identity = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    environment = {**os.environ, **identity}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    for message in ("older", "newer"):
        subprocess.run(
            ["git", "commit", "-q", "--allow-empty", "-m", message], cwd=tmp_path, env=environment, check=True
        )
    listing = subprocess.run(["git", "rev-list", "--reverse", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    older_full, newer_full = listing.stdout.split()
    older, newer = older_full[:7], newer_full + "-dirty"  # records name commits either way

    def record(commit: str | None, gpu: float) -> dict:
        return {"id": "a", "strategy": "deepspeed_stage_3", "size": "1.3b", "length": 1024, "gpu_measured_gib": gpu,
                "host_measured_gib": 3.0, "git_commit": commit}  # fmt: skip

    # File names sort the newer commit's record first, and a record from before commits were kept last.
    (tmp_path / "a-memory-accuracy.json").write_text(json.dumps([record(newer, 2.0)]))
    (tmp_path / "b-memory-accuracy.json").write_text(json.dumps([record(older, 1.0)]))
    (tmp_path / "c-memory-accuracy.json").write_text(json.dumps([record(None, 0.5)]))
    assert [r["gpu_measured_gib"] for r in memory_plots.measured_configurations(tmp_path)] == [2.0]


def test_report_without_results_says_none_were_measured(tmp_path: Path) -> None:
    from tools.benchmark import report

    page = tmp_path / "benchmarks.md"
    report.write(tmp_path / "results", page)
    assert "No results have been measured yet" in page.read_text()
    assert "tokens/s |" not in page.read_text()


def test_the_report_reads_every_session_kept_in_the_repository(tmp_path: Path) -> None:
    """Each summary in docs/results names its records file beside it (a session copied in under another name once
    did not, and `python -m tools.benchmark report` ended in a FileNotFoundError)."""
    from tools.benchmark import report

    kept = REPOSITORY / "docs" / "results"
    shutil.copytree(kept, tmp_path / "results")  # the report draws its plots beside the records
    summaries = sorted(kept.glob("*.summary.json"))
    assert summaries
    for summary in summaries:
        assert (kept / json.loads(summary.read_text())["results_file"]).is_file(), summary.name
    report.write(tmp_path / "results", tmp_path / "records.md")
    assert len(report.load_sessions(tmp_path / "results")) == len(summaries)


def test_a_crashing_run_becomes_a_recorded_failure(tmp_path: Path) -> None:
    # A batch of zero sequences makes the DataLoader raise inside the worker process.
    arguments = [*TINY]
    arguments[arguments.index("--batch-size") + 1] = "0"
    completed = benchmark(
        "run", "--runs", "hand:torch", "--repeats", "1", "--out", str(tmp_path), "--label", "crash", *arguments
    )
    assert completed.returncode == 0, completed.stderr
    _, records = read_session(tmp_path, "crash")
    assert records[0]["status"] == "failed"
    assert records[0]["failure"]["reason"] == "other"
    assert "batch_size" in records[0]["failure"]["message"]


def test_parameter_count_and_flops_match_the_model() -> None:
    model = GPT(SIZES["tiny"], 32)
    assert parameter_count(SIZES["tiny"], 32) == sum(parameter.numel() for parameter in model.parameters())
    size = SIZES["1.3b"]
    assert 1.2e9 < parameter_count(size, 1024) - 2 * 50304 * size.width < 1.3e9  # without embeddings and head
    assert training_flops_per_token(size, 1024) == 6 * (24 * 12 * 2048**2 + 50304 * 2048) + 12 * 24 * 2048 * 1024


def test_failure_reasons_and_device_peaks() -> None:
    assert classify_failure("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == "oom_gpu"
    assert classify_failure("", return_code=-9) == "killed_host_memory"
    host = "RuntimeError: [enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"
    assert classify_failure(host) == "oom_host"
    assert classify_failure("ValueError: bad", return_code=1) == "other"
    assert peak_bf16_flops("NVIDIA H200") == peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_bf16_flops("Some Future GPU") is None


def test_presets_name_known_runs() -> None:
    for run_ids in PRESETS.values():
        assert {run_id.partition("@")[0] for run_id in run_ids} <= set(RUNS)
    assert all(RUNS[run].partner in (None, *RUNS) for run in RUNS)


@pytest.fixture(scope="module")
def repeated_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[dict]]:
    out = tmp_path_factory.mktemp("repeated")
    completed = benchmark("run", "--runs", "hand:fsdp,trainer:fsdp,hand:gemini_cuda", "--repeats", "2",
                          "--repeats-gemini", "3", "--out", str(out), "--label", "repeated", *TINY,
                          "--checkpoint-dir", str(out / "checkpoints"), "--logs", str(out / "logs"))  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return (out, *read_session(out, "repeated"))


def test_repeats_run_interleaved_round_by_round(repeated_session) -> None:
    _, _, records = repeated_session
    assert [(r["run"], r["repeat"]) for r in records] == [
        ("hand:fsdp", 1), ("trainer:fsdp", 1), ("hand:gemini_cuda", 1),
        ("hand:fsdp", 2), ("trainer:fsdp", 2), ("hand:gemini_cuda", 2),
        ("hand:gemini_cuda", 3),
    ], [(r["run"], r["status"], r.get("failure")) for r in records]  # fmt: skip
    assert [r["status"] for r in records if r["run"] != "hand:gemini_cuda"] == ["ok"] * 4


def test_the_trainer_run_logs_every_step_shows_a_progress_bar_and_saves_a_checkpoint(repeated_session) -> None:
    out, _, records = repeated_session
    for record in (r for r in records if r["status"] == "ok"):
        assert record["checkpoint_seconds"] > 0 and record["checkpoint_bytes"] > 0, record["run"]
        # The save is timed after the steps, and the steps alone give tokens/s.
        assert record["end_to_end_seconds"] >= record["seconds_per_step"] * record["timed_steps"]
        assert record["tokens_per_second_with_checkpoint"] < record["tokens_per_second"]
        assert len(record["step_seconds"]) == record["timed_steps"]
        assert record["gc_seconds"] >= 0 and record["gc_collections"] >= 0
        assert record["load_average"] >= 0 and record["usable_cpus"] >= 1 and record["gpu_clock_mhz"] is None
        # The training loop's thread ran on the CPU for part of the timed wall time (all of it, on CPU).
        assert 0 < record["main_thread_cpu_seconds"] <= record["process_cpu_seconds"]
        assert record["main_thread_busy"] > 0 and record["main_thread_involuntary_switches"] >= 0
    for record in (r for r in records if r["run"] == "trainer:fsdp"):
        assert record["loss_logged_steps"] == record["warmup_steps"] + record["timed_steps"]
        assert record["loss_in_progress_bar"] is True and record["progress_bar"] == "TQDMProgressBar"
        assert "loss=" in Path(record["log"]).read_text()  # the bar, as printed
    assert not list((out / "checkpoints").iterdir())  # each run's checkpoint folder is deleted after it


def test_summary_and_table_give_medians_spreads_and_ratios(repeated_session) -> None:
    out, summary, records = repeated_session
    rows = {row["run"]: row for row in summary["repeated"]}
    hand = [r["tokens_per_second"] for r in records if r["run"] == "hand:fsdp"]
    ours = [r["tokens_per_second"] for r in records if r["run"] == "trainer:fsdp"]
    assert rows["trainer:fsdp"]["measured"] == rows["trainer:fsdp"]["repeats"] == 2
    assert rows["trainer:fsdp"]["median_tokens_per_second"] == pytest.approx(sum(ours) / 2)
    assert rows["trainer:fsdp"]["vs_by_hand"] == pytest.approx(sum(ours) / sum(hand))
    assert rows["trainer:fsdp"]["spread_percent"] == pytest.approx(100 * (max(ours) - min(ours)) / min(ours))
    assert rows["hand:gemini_cuda"]["repeats"] == 3 and rows["hand:gemini_cuda"]["measured"] == 0
    assert summary["complete"] is True and summary["not_run_for_budget"] == []
    assert "| `trainer:fsdp` | tiny | 1 | 2/2 |" in (out / "repeated.md").read_text()


def test_report_shows_the_repeated_runs(repeated_session, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out, _, _ = repeated_session
    page = tmp_path / "benchmarks.md"
    completed = benchmark("report", "--results", str(out), "--page", str(page))
    assert completed.returncode == 0, completed.stderr
    assert "ratios are of medians" in page.read_text() and "| `trainer:fsdp` | tiny | 1 | 2/2 |" in page.read_text()


def fake_record(run: str, tokens_per_second: float | None, repeat: int = 1, partner: str | None = None) -> dict:
    record = {"run": run, "kind": run.split(":")[0], "partner": partner, "size": "1.3b", "devices": 1,
              "precision": "bf16-mixed", "repeat": repeat, "status": "ok", "tokens_per_second": tokens_per_second,
              "checkpoint_seconds": 2.0, "tokens_per_second_with_checkpoint": (tokens_per_second or 0) / 2,
              "step_seconds": [1.0, 1.0, 3.0]}  # fmt: skip
    if tokens_per_second is None:
        record.update(status="failed", failure={"reason": "oom_gpu"})
    return record


def test_schedule_interleaves_and_gives_gemini_its_extra_rounds() -> None:
    order = repeats.schedule(["hand:fsdp", "trainer:fsdp", "trainer:colossalai_cuda"],
                             lambda run: 5 if "colossalai" in run else 3)  # fmt: skip
    assert order[:4] == [(1, "hand:fsdp"), (1, "trainer:fsdp"), (1, "trainer:colossalai_cuda"), (2, "hand:fsdp")]
    assert order[-3:] == [
        (3, "trainer:colossalai_cuda"),
        (4, "trainer:colossalai_cuda"),
        (5, "trainer:colossalai_cuda"),
    ]
    assert len(order) == 11


def test_aggregate_takes_ratios_of_medians_and_flags_a_spread_over_five_percent() -> None:
    records = [
        *(fake_record("hand:fsdp", value, i) for i, value in enumerate([100, 110, 90], 1)),
        *(fake_record("trainer:fsdp", value, i, "hand:fsdp") for i, value in enumerate([97, 99, 98], 1)),
        *(fake_record("lightning:fsdp", value, i, "hand:fsdp") for i, value in enumerate([80, 90, None], 1)),
    ]
    rows = {row["run"]: row for row in repeats.aggregate(records)}
    assert rows["hand:fsdp"]["median_tokens_per_second"] == 100
    assert rows["hand:fsdp"]["spread_percent"] == pytest.approx(100 * 20 / 90)
    assert rows["trainer:fsdp"]["vs_by_hand"] == pytest.approx(0.98)
    assert rows["trainer:fsdp"]["vs_built_in"] == pytest.approx(98 / 85)
    assert rows["lightning:fsdp"]["measured"] == 2 and rows["lightning:fsdp"]["failures"] == ["oom_gpu"]
    assert rows["hand:fsdp"]["vs_by_hand"] is None and rows["hand:fsdp"]["vs_built_in"] is None
    assert rows["trainer:fsdp"]["longest_step_over_median"] == 3.0
    text = "\n".join(repeats.table(list(rows.values())))
    assert "22.2% (not steady)" in text and "| 2.1% | 0.98 | 1.15 |" in text


def test_a_budget_stops_runs_that_would_not_end_in_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = orchestrate.Session(tmp_path, "budget", tmp_path / "logs", 100, {"settings": {}}, budget=25)
    session.start()
    timeouts = []

    def fake_measure(session, run, workload, timeout=None, **extra):
        timeouts.append(timeout)
        session.began -= 10  # each run takes 10 s
        record = {**fake_record(run.id, 50.0, extra["repeat"]), "wall_seconds": 10.0}
        session.append(record)
        return record

    monkeypatch.setattr(orchestrate, "measure", fake_measure)
    base = orchestrate.Workload(run="")
    runs = resolve(["hand:fsdp", "trainer:fsdp", "lightning:fsdp"])
    orchestrate.run_all(session, runs, base, [1], lambda run: 2)
    summary = json.loads(session.summary_path.read_text())
    # Two runs of 10 s fit in 25 s; a third (expected to take as long as the others) would end after it.
    assert [record["run"] for record in session.records()] == ["hand:fsdp", "trainer:fsdp"]
    assert summary["not_run_for_budget"] == [
        "lightning:fsdp x1 repeat 1", "hand:fsdp x1 repeat 2", "trainer:fsdp x1 repeat 2", "lightning:fsdp x1 repeat 2"
    ]  # fmt: skip
    assert summary["complete"] is True and len(summary["repeated"]) == 2
    assert timeouts == [pytest.approx(25, abs=1), pytest.approx(15, abs=1)]  # capped by what the budget leaves


def test_variants_are_the_plain_run_with_an_environment() -> None:
    run = resolve(["trainer:colossalai_cuda@expandable_segments"])[0]
    assert (run.name, run.kind, run.variant, run.base) == (
        "colossalai_cuda",
        "trainer",
        "expandable_segments",
        "trainer:colossalai_cuda",
    )
    assert run.environment == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert run.partner == "hand:gemini_cuda" and set(VARIANTS) >= {"expandable_segments", "gc_frozen"}
    for preset in ("dropin", "colossalai_variants"):
        assert resolve(PRESETS[preset])
    with pytest.raises(SystemExit, match="Unknown variant"):
        resolve(["trainer:fsdp@nonsense"])
    # "unpinned" configures the by-hand Gemini loop: on any other run it would measure the plain run.
    assert resolve(["hand:gemini_cuda@unpinned"])[0].variant == "unpinned"
    with pytest.raises(SystemExit, match="trainer:colossalai_cuda@unpinned: the variant changes only"):
        resolve(["trainer:colossalai_cuda@unpinned"])


def test_resident_memory_of_a_rank_and_of_the_tree_read_the_same_status_fields() -> None:
    """``resident_gib`` (a rank's stages) and ``tree_rss`` (the host sampler) read one parse of /proc's status."""
    import os

    from tools.benchmark.memory_accuracy import resident_gib, tree_rss

    child = subprocess.Popen(["sleep", "30"])
    try:
        now, peak = resident_gib()
        tree = tree_rss(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert now > 0 and peak > 0.9 * now  # getrusage's peak may trail VmRSS by the last few pages
    ours = [(name, size) for name, size in tree.items() if name.startswith(f"{os.getpid()} ")]
    assert len(ours) == 1 and abs(ours[0][1] / 2**30 - now) < 0.1  # the same VmRSS, read a moment apart
    assert any(name.startswith(f"{child.pid} sleep anon/file/shmem/hwm kB ") for name in tree), tree
    assert all("?" not in name for name in tree)  # every kind of resident memory was found in the status


def test_a_tree_over_the_host_limit_is_stopped_and_the_moment_noted() -> None:
    from tools.benchmark.memory_accuracy import TreeSampler

    holder = "import time; held = bytearray(400 * 2**20); time.sleep(60)"  # 400 MiB resident, then waits
    process = subprocess.Popen([sys.executable, "-c", holder])
    sampler = TreeSampler(process.pid, interval=0.05, limit=200 * 2**20)
    sampler.start()
    try:
        returncode = process.wait(timeout=30)
    finally:
        process.kill()
        peak = sampler.stop()
    assert returncode == -9 and sampler.stopped_at is not None
    assert peak > 200 * 2**20


def test_the_nodes_launchers_share_one_deadline() -> None:
    import time

    from tools.benchmark.memory_accuracy import read_outputs

    # One process each, no child: a shell's sleep killed first would let the shell exit on its own (137), a race.
    hanging = "print('started', flush=True); import time; time.sleep(60)"
    hung = [subprocess.Popen([sys.executable, "-c", hanging], stdout=subprocess.PIPE, text=True) for _ in "ab"]
    timeout = 2.0
    started = time.monotonic()
    try:
        outputs = read_outputs(hung, timeout)
        elapsed = time.monotonic() - started
        returncodes = [process.poll() for process in hung]
    finally:
        for process in hung:
            process.kill()
            process.wait()
    # Read one after another, each with a timeout of its own, the two would take twice the timeout.
    assert elapsed < 1.5 * timeout
    assert returncodes == [-9, -9]  # both killed by the harness, the second with no time of its own
    assert outputs == ["started\n", "started\n"]  # what each printed before it was killed


def test_lightning_builtin_is_predicted_as_our_strategy_of_the_same_settings() -> None:
    pytest.importorskip("lightning_strategies_deepspeed")
    from tools.benchmark.memory_accuracy import BY_ID, prediction

    builtin = BY_ID["builtin-ds3-offload-13b-accumulate-8"]
    predicted = prediction(builtin, 139, 125)
    assert predicted["strategy"] == "deepspeed_stage_3_offload" and predicted["settings"] == builtin.settings
    assert predicted["fits"] is False  # every state offloaded: far more than 125 GiB of host memory


def test_two_nodes_on_one_machine_launch_under_torchrun_each_with_its_own_gpus() -> None:
    from tools.benchmark.memory_accuracy import BY_ID, launcher, node_devices

    two_nodes = BY_ID["ds3-2x2-6.7b"]
    assert [argument for argument in launcher(two_nodes, 1) if "node" in argument] == [
        "--nnodes=2", "--node-rank=1", "--nproc-per-node=2",
    ]  # fmt: skip
    assert [node_devices(two_nodes, node, "cuda") for node in (0, 1)] == [
        {"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"},
    ]  # fmt: skip
    assert launcher(BY_ID["fsdp-4x-20b"], 0) == [] and node_devices(BY_ID["fsdp-4x-20b"], 0, "cuda") == {}


def test_two_nodes_are_predicted_with_each_nodes_host_memory() -> None:
    pytest.importorskip("lightning_strategies_deepspeed")
    import dataclasses

    from tools.benchmark.memory_accuracy import BY_ID, prediction

    two_nodes = BY_ID["ds3-2x2-6.7b"]
    one_node = dataclasses.replace(two_nodes, devices=4, nodes=1)
    per_node, whole = prediction(two_nodes, 139, 500), prediction(one_node, 139, 500)
    # The same four processes sharding the same model: equal GPU peaks, and each node's host holds two of them.
    assert per_node["gpu_peak_gib"] == whole["gpu_peak_gib"]
    assert per_node["host_peak_gib"] < whole["host_peak_gib"]


def test_hugging_face_suite_runs_rounds_and_its_page_gives_medians(tmp_path: Path) -> None:
    """A tiny Llama through fsdp on two CPU processes, two rounds: two records, one row of two runs, a plot."""
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    from tools.benchmark import hugging_face_suite as suite

    suite.main([
        "run", "--size", "tiny", "--devices", "2", "--accelerator", "cpu", "--precision", "32-true", "--batch", "2",
        "--length", "32", "--steps", "4", "--repeats", "2", "--only", "fsdp", "--timeout", "300",
        "--out", str(tmp_path),
    ])  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "hugging-face-tiny.jsonl").read_text().splitlines()]
    assert [record["tokens_per_second"] > 0 for record in records] == [True, True]
    assert not (tmp_path / "failures.jsonl").exists()
    (row,) = suite.rows(records)
    assert (row["configuration"], row["runs"], row["devices"]) == ("fsdp", 2, 2)
    assert row["lowest"] <= row["median"] <= row["highest"]
    text = suite.page([tmp_path / "hugging-face-tiny.jsonl"], tmp_path / "page.md")
    assert f"| fsdp | 2 | 2 | {row['median']:,.0f} |" in text
    assert (tmp_path / "page.png").stat().st_size > 0


def test_hugging_face_page_gives_the_medians_the_docs_state() -> None:
    """The medians docs/hugging-face.md and benchmarks.md state for the 8B compile runs are its record's."""
    from tools.benchmark import hugging_face_suite as suite

    record = REPOSITORY / "docs" / "results" / "2026-11-28-h200x4-hugging-face-8b-compile.jsonl"
    records = [json.loads(line) for line in record.read_text().splitlines()]
    table = {row["configuration"]: row for row in suite.rows(records)}
    assert (table["fsdp"]["runs"], table["fsdp"]["median"]) == (3, 35531)
    assert (table["fsdp compiled"]["runs"], table["fsdp compiled"]["median"]) == (3, 42750)
    assert (
        table["fsdp compiled, bf16 reduce"]["median"],
        round(100 * table["fsdp compiled, bf16 reduce"]["mfu"], 1),
    ) == (44399, 54.1)


def test_the_float8_medians_the_docs_state_are_the_records() -> None:
    """docs/hugging-face.md's float8 table on two GPUs, from its record; the float8 gathers run before the strategy
    computed their scales (commit 008efcf) are a row of their own there."""
    from tools.benchmark import hugging_face_suite as suite

    record = REPOSITORY / "docs" / "results" / "2026-11-29-h200x2-hugging-face-8b-float8.jsonl"
    records = [json.loads(line) for line in record.read_text().splitlines()]
    before = [record for record in records if record["float8"] == "all-gather" and record["git_commit"] == "008efcf"]
    table = {row["configuration"]: row for row in suite.rows([record for record in records if record not in before])}
    medians = {name: (row["runs"], round(row["median"]), round(100 * row["mfu"], 1)) for name, row in table.items()}
    assert medians == {
        "fsdp compiled": (5, 21346, 52.1),
        "fsdp compiled, float8": (4, 27064, 66.0),
        "fsdp compiled, float8 gathers": (3, 26400, 64.4),
    }
    assert statistics.median(record["tokens_per_second"] for record in before) == 23929.5
    later = REPOSITORY / "docs" / "results" / "2026-11-29-h200x2-hugging-face-8b-float8-53f5f1a.jsonl"
    runs = [
        (record["float8"], record["tokens_per_second"]) for record in map(json.loads, later.read_text().splitlines())
    ]
    assert runs == [("all-gather", 26316), ("tensorwise", 26623), ("all-gather", 26083)]


def test_runs_on_text_keep_every_loss_and_their_curves_are_tabulated_and_plotted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tiny Llama learns the bytes of a folder's .py files on one CPU process: each loss is kept, the curves page
    gives the run's row and a plot; a folder too small for the run is refused, naming what it holds and needs."""
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    from tools.benchmark import hugging_face
    from tools.benchmark import hugging_face_suite as suite

    text = tmp_path / "text"
    text.mkdir()
    (text / "a.py").write_text("def add(a, b):\n    return a + b\n" * 40)
    (text / "b.py").write_text("print('hello')\n" * 40)
    (text / "notes.txt").write_text("not read")
    common = ["--size", "tiny", "--strategy", "auto", "--accelerator", "cpu", "--precision", "32-true",
              "--batch", "2", "--length", "32", "--lr", "1e-2", "--text", str(text)]  # fmt: skip
    out = tmp_path / "curves.jsonl"
    hugging_face.main([*common, "--steps", "20", "--out", str(out)])
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (len(record["losses"]), record["data"], record["seed"]) == (20, str(text), 0)
    assert statistics.fmean(record["losses"][-2:]) < statistics.fmean(record["losses"][2:4])  # it learns
    table = suite.curves([out], tmp_path / "curves.png")
    (row,) = suite.curve_rows([record])
    assert f"| tiny | 1 | bf16 | 0 | 20 | {row['tokens_per_second']:,} |" in table
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert record["data_bytes"] == 20 * 2 * 32
    (short,) = suite.curve_rows([{**record, "losses": record["losses"][:5]}])  # under ten steps: a step a tenth
    assert short["final_loss"] == round(record["losses"][4], 3)
    one_step = tmp_path / "one-step.jsonl"  # too short to be timed: no speed, one loss for both tenths
    one_step.write_text(json.dumps({**record, "losses": record["losses"][:1], "tokens_per_second": None}))
    loss = round(record["losses"][0], 3)
    assert f"| tiny | 1 | bf16 | 0 | 1 |  |  | {loss} | {loss} |" in suite.curves([one_step], tmp_path / "one.png")
    with pytest.raises(SystemExit, match="hold 1,880 bytes, and 64,000 are needed"):
        hugging_face.Text(text, 32, 2000, 128)
    for wrong, told in (["--text", str(text / "a.py")], "is not a folder"), (["--steps", "0"], "--steps must be"):
        with pytest.raises(SystemExit):  # refused before anything is built
            hugging_face.main([*common, *wrong, "--out", str(out)])
        assert told in capsys.readouterr().err


def test_the_loss_curves_the_docs_state_are_the_records() -> None:
    """docs/hugging-face.md's table of float8 against bf16 on text: each row computed from its record."""
    from tools.benchmark import hugging_face_suite as suite

    record = REPOSITORY / "docs" / "results" / "2026-11-29-h200x2-float8-loss-curves.jsonl"
    records = [json.loads(line) for line in record.read_text().splitlines()]
    docs = (REPOSITORY / "docs" / "hugging-face.md").read_text()
    rows = suite.curve_rows(records)
    assert len(rows) == 6
    for row in rows:
        line = (
            f"| {row['size'].upper()} | {row['matmuls'].split()[0]} | {row['seed']} | {row['steps']} | "
            f"{row['tokens_per_second']:,} | {100 * row['mfu']:.1f}% | {row['early_loss']:.3f} | "
            f"{row['final_loss']:.3f} |"
        )
        assert line in docs


def _kept_parts(folder: Path) -> Path:
    """The folders `reproduce run` fills, from sessions kept in docs/results: the four-GPU scaling session, the
    Hugging Face 8B on four GPUs and two 13B offload rounds on one GPU."""
    kept = REPOSITORY / "docs" / "results"
    for part in ("scaling", "hugging-face", "offload/round-1", "offload/round-2"):
        (folder / part).mkdir(parents=True)
    for suffix in (".jsonl", ".summary.json"):
        shutil.copy(kept / f"2026-11-28-h200x4-scaling-1.3b-4x{suffix}", folder / "scaling")
    shutil.copy(kept / "2026-11-28-h200x4-hugging-face-8b-compile.jsonl", folder / "hugging-face/hugging-face-8b.jsonl")
    for round_, name in enumerate(
        ["2026-11-24-h200-memory-accuracy-ds-13b-fp32-1x", "2026-11-23-h200-memory-accuracy-largest-1x"], 1
    ):
        shutil.copy(kept / f"{name}.json", folder / f"offload/round-{round_}/memory-accuracy.json")
    return folder


def test_the_reproduction_page_gives_medians_speedups_and_plots_of_every_part(tmp_path: Path) -> None:
    from tools.benchmark import reproduce

    out = _kept_parts(tmp_path / "out")
    text = reproduce.page(out)
    assert (out / "README.md").read_text() == text
    records = [json.loads(line) for line in (out / "scaling/2026-11-28-h200x4-scaling-1.3b-4x.jsonl").open()]
    for run in ("trainer:deepspeed_stage_3", "trainer:colossalai_cuda"):
        speeds = {r["devices"]: r["tokens_per_second"] for r in records if r["run"] == run and r["status"] == "ok"}
        row = next(line for line in text.splitlines() if line.startswith(f"| `{run}` |"))
        assert row.endswith(f"| {speeds[4] / speeds[1]:.2f}x |") and f"{speeds[4]:,.0f}" in row
    (offloaded,) = [
        r
        for r in json.load((out / "offload/round-1/memory-accuracy.json").open())
        if r["id"] == "largest-ds3-13b-accumulate-8"
    ]
    row = next(line for line in text.splitlines() if line.startswith("| largest-ds3-13b-accumulate-8 |"))
    assert f"{offloaded['speed']['tokens_per_second']:,.0f}" in row and f"{100 * offloaded['speed']['mfu']:.1f}%" in row
    assert "| fsdp compiled | 4 |" in text  # the Hugging Face suite's own table
    for name in ("scaling.png", "sizes.png", "hugging-face/page.md"):
        assert (out / name).stat().st_size > 0, name


def test_reproduce_runs_a_part_and_says_how_each_ended(tmp_path: Path) -> None:
    """The scaling part on CPU (tiny model; the runs that need CUDA are recorded as skipped), then the page."""
    from tools.benchmark import reproduce

    tiny = "--batch-size 2 --length 32 --warmup-steps 1 --timed-steps 2"
    reproduce.main([
        "run", "--out", str(tmp_path), "--parts", "scaling", "--accelerator", "cpu", "--devices", "2",
        "--repeats", "1", "--scaling-size", "tiny", "--scaling-args", tiny, "--timeout", "300",
    ])  # fmt: skip
    (ended,) = [json.loads(line) for line in (tmp_path / "parts.jsonl").open()]
    assert (
        ended["part"] == "scaling"
        and ended["exit"] == 0
        and ended["command"].startswith("python -m tools.benchmark run")
    )
    text = (tmp_path / "README.md").read_text()
    assert "| `trainer:fsdp` |" in text and "Not measured (no records in hugging-face/)" in text
    assert "| `trainer:deepspeed_stage_2` | skipped: " in text  # the CUDA-only runs: named, with why
    assert ended["command"] in text and (tmp_path / "scaling.png").is_file()


def _gpt_record(run: str, devices: int, tokens_per_second: float | None, mfu: float | None = None) -> dict:
    """A record of `tools.benchmark run` as the harness writes it (the fields the page reads)."""
    if tokens_per_second is None:
        return {"run": run, "devices": devices, "size": "1.3b", "parameters": 1.3e9, "status": "failed",
                "failure": {"reason": "oom_gpu", "message": "CUDA out of memory"}}  # fmt: skip
    return {"run": run, "devices": devices, "size": "1.3b", "parameters": 1.3e9, "status": "ok",
            "tokens_per_second": tokens_per_second, "mfu": mfu}  # fmt: skip


def test_the_reproduction_tables_take_medians_over_rounds_and_say_why_a_run_has_none() -> None:
    from tools.benchmark import reproduce

    # Three rounds whose median is neither their mean nor the last of them.
    records = [_gpt_record("trainer:fsdp", 1, speed, mfu) for speed, mfu in ((100, 0.40), (130, 0.52), (90, 0.36))]
    records += [_gpt_record("trainer:fsdp", 4, speed, 0.3) for speed in (380, 300, 370)]
    records += [_gpt_record("trainer:deepspeed_stage_3", 1, 80), _gpt_record("trainer:deepspeed_stage_3", 4, None)]
    fsdp, zero = reproduce.scaling_rows(records)
    assert fsdp["by_devices"][1] == {"runs": 3, "tokens_per_second": (100, 90, 130), "mfu": 0.40}
    assert fsdp["by_devices"][4]["tokens_per_second"] == (370, 300, 380)
    assert fsdp["speedup"] == 370 / 100
    assert zero["not_measured"] == {4: "failed: oom_gpu"} and "speedup" not in zero

    def offloaded(speed: float | None, gpu: float | None, error: float | None) -> dict:
        return {"id": "largest-ds3-13b", "strategy": "deepspeed_stage_3", "size": "13b", "length": 1024,
                "gpu_predicted_gib": 100.0,
                "gpu_measured_gib": gpu, "host_predicted_gib": 50.0, "host_measured_gib": 49.0, "gpu_error": error,
                "host_error": 0.0, "failure": None if speed else "killed",
                "speed": {"tokens_per_second": speed, "mfu": 0.2} if speed else None}  # fmt: skip

    (row,) = reproduce.offload_rows(
        [offloaded(2800, 101.0, 0.01), offloaded(2900, 99.0, -0.03), offloaded(None, None, None)]
    )
    assert row["tokens_per_second"] == (2850, 2800, 2900) and row["runs"] == 2 and row["failures"] == ["killed"]
    assert row["gpu"] == (100.0, 101.0) and row["worst_error"] == 0.03
    assert row["billions"] == pytest.approx(13.1, abs=0.05)  # counted from the shape, not read from its name


def test_reproduce_does_not_measure_a_part_twice_into_one_folder(tmp_path: Path) -> None:
    from tools.benchmark import reproduce

    (tmp_path / "offload" / "round-1").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"offload: measured by an earlier call\. Measure into another --out"):
        reproduce.main(["run", "--out", str(tmp_path), "--parts", "offload"])
    assert not (tmp_path / "parts.jsonl").exists()


def test_the_deepspeed_float8_runs_the_docs_state_are_the_records() -> None:
    """docs/hugging-face.md's paragraph on float8 under deepspeed_stage_3: every run from its record."""
    record = REPOSITORY / "docs" / "results" / "2026-11-30-h200x2-hugging-face-8b-ds3-float8.jsonl"
    docs = (REPOSITORY / "docs" / "hugging-face.md").read_text()
    paragraph = docs[docs.index("- **Under `deepspeed_stage_3`**") :].split("\n- ", 1)[0].split("\n\n", 1)[0]
    paragraph = " ".join(paragraph.split())
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert {run["strategy"] for run in runs} == {"deepspeed_stage_3"} and len(runs) == 4
    kinds = {kind: [run for run in runs if run["float8"] == kind] for kind in (None, "tensorwise")}
    for first, second in kinds.values():
        assert f"{first['tokens_per_second']:,} and {second['tokens_per_second']:,}" in paragraph
        assert f"{100 * first['mfu']:.1f}% and {100 * second['mfu']:.1f}%" in paragraph
        assert first["peak_gpu_reserved_gib"] == second["peak_gpu_reserved_gib"]
    bf16, float8 = (sum(run["tokens_per_second"] for run in kinds[kind]) for kind in (None, "tensorwise"))
    assert f"{float8 / bf16:.2f}x" in paragraph
    reserved = [kinds[kind][0]["peak_gpu_reserved_gib"] for kind in ("tensorwise", None)]
    assert f"{reserved[0]:.1f} GiB of GPU memory reserved against {reserved[1]:.1f}" in paragraph


def test_the_13b_rows_with_the_gradients_on_the_gpu_are_the_records() -> None:
    """docs/which-strategy.md's table of where ZeRO-3's offloaded gradients accumulate at 13.1B, and the bullets
    under it, from its record (the steps after the first)."""
    record = REPOSITORY / "docs" / "results" / "2026-11-30-h200-memory-accuracy-ds3-gradients-on-gpu-1x.json"
    docs = (REPOSITORY / "docs" / "which-strategy.md").read_text()
    flat = " ".join(docs.split())
    runs = {run["id"]: run for run in json.loads(record.read_text()) if run["size"] == "13b"}
    per_micro_batch = {}
    for name, label in (
        ("largest-ds3-13b-accumulate-8", "| in their fp32 gradients on the host (the plan's settings) | 8 |"),
        ("largest-ds3-13b-accumulate-8-on-gpu", "| on the GPU | 8 |"),
        ("largest-ds3-13b-accumulate-32-on-gpu", "| on the GPU | 32 |"),
    ):
        run = runs[name]
        phases = run["speed"]["phases"][1:]
        forward_backward = [phase["forward_backward_s"] for phase in phases]
        optimizer = [phase["optimizer_s"] for phase in phases]
        per_micro_batch[name] = [seconds / run["accumulate"] for seconds in forward_backward]
        row = (
            label,
            f"| {min(forward_backward):.1f} to {max(forward_backward):.1f} s |",
            f"| {min(optimizer):.1f} to {max(optimizer):.1f} s |",
            f"{round(run['speed']['tokens_per_second']):,}",
            f"{100 * run['speed']['mfu']:.1f}%",
            f"{run['gpu_measured_gib']:.1f} GiB ({run['gpu_predicted_gib']:.1f})",
            f"{run['host_measured_gib']:.1f} GiB ({run['host_predicted_gib']:.1f})",
        )
        assert any(all(part in line for part in row) for line in docs.splitlines()), (name, row)
    on_gpu = (
        per_micro_batch["largest-ds3-13b-accumulate-8-on-gpu"] + per_micro_batch["largest-ds3-13b-accumulate-32-on-gpu"]
    )
    on_host = per_micro_batch["largest-ds3-13b-accumulate-8"]
    assert f"{min(on_gpu):.2f} to {max(on_gpu):.2f} s a micro-batch" in flat
    assert f"{min(on_host):.2f} to {max(on_host):.2f} s" in flat
    ratio = statistics.median(on_host) / statistics.median(per_micro_batch["largest-ds3-13b-accumulate-8-on-gpu"])
    assert f"{ratio:.2f}x at 8 micro-batches" in flat
    losses = runs["largest-ds3-13b-accumulate-32-on-gpu"]["speed"]["losses"]
    assert f"fell from {losses[0]:.2f} to {losses[-1]:.2f}" in flat


def test_the_13b_repeats_at_32_micro_batches_are_the_record() -> None:
    """docs/which-strategy.md's three runs of each at 32 micro-batches (the plan's settings and the GPU buffer, one
    pair a call), figure by figure from its record: the step after the first, medians, spreads, the ratio, the
    GPU peaks, and the planner's constants the bullets name."""
    from lightning_strategies.planning.candidates import CHOICE_MARGIN
    from lightning_strategies.planning.fitted import FITTED

    record = REPOSITORY / "docs" / "results" / "2026-11-30-h200-memory-accuracy-ds3-13b-accumulate-32-repeats-1x.json"
    docs = (REPOSITORY / "docs" / "which-strategy.md").read_text()
    section = docs[docs.index("Three runs of each at 32 micro-batches") : docs.index("## The largest model on one GPU")]
    flat = " ".join(section.split())
    runs = sorted(json.loads(record.read_text()), key=lambda run: run["call"])
    assert not any(run["failure"] for run in runs)
    for call in (1, 2, 3):
        assert sorted(run["id"] for run in runs if run["call"] == call) == [
            "largest-ds3-13b-accumulate-32", "largest-ds3-13b-accumulate-32-on-gpu"
        ]  # fmt: skip
    (commit,), (date,) = {run["git_commit"] for run in runs}, {run["date"] for run in runs}
    (allocator,) = {run["environment"]["PYTORCH_CUDA_ALLOC_CONF"] for run in runs}
    assert f"{date}, commit {commit}, `PYTORCH_CUDA_ALLOC_CONF={allocator}`" in flat
    medians, mfus, peaks = {}, {}, {}
    for name, label in (
        ("largest-ds3-13b-accumulate-32", "| in their fp32 gradients on the host (the plan's settings) | "),
        ("largest-ds3-13b-accumulate-32-on-gpu", "| on the GPU | "),
    ):
        group = [run for run in runs if run["id"] == name]
        assert len(group) == 3 and {run["accumulate"] for run in group} == {32}
        assert {len(run["speed"]["phases"]) for run in group} == {2}  # the first step, then the one timed
        tokens = [run["speed"]["tokens_per_second"] for run in group]
        forward_backward = [run["speed"]["phases"][1]["forward_backward_s"] for run in group]
        optimizer = [run["speed"]["phases"][1]["optimizer_s"] for run in group]
        medians[name] = statistics.median(tokens)
        mfus[name] = f"{100 * statistics.median(run['speed']['mfu'] for run in group):.1f}%"
        (allocated,) = {run["gpu_measured_gib"] for run in group}
        (reserved,) = {run["gpu_reserved_per_device_gib"][0] for run in group}
        peaks[name] = allocated, reserved
        median, mfu = f"{round(medians[name]):,}", mfus[name]
        row = (
            label + ", ".join(f"{round(value):,}" for value in tokens) + " |",
            f"| {100 * (max(tokens) - min(tokens)) / min(tokens):.1f}% |",
            f"| {min(forward_backward):.1f} to {max(forward_backward):.1f} s |",
            f"| {min(optimizer):.1f} to {max(optimizer):.1f} s |",
            f"| {allocated:.1f} / {reserved:.1f} GiB |",
        )
        lines = [line for line in section.splitlines() if all(part in line for part in row)]
        assert len(lines) == 1, (name, row)
        cells = [cell.strip().strip("*") for cell in lines[0].split("|")]
        assert cells[3] == median and cells[5] == mfu, (name, cells)
    plan, buffer = "largest-ds3-13b-accumulate-32", "largest-ds3-13b-accumulate-32-on-gpu"
    assert f"{medians[buffer] / medians[plan]:.2f}x faster at 32 micro-batches" in flat
    assert min(run["speed"]["tokens_per_second"] for run in runs if run["id"] == buffer) > max(
        run["speed"]["tokens_per_second"] for run in runs if run["id"] == plan
    )  # "every run with it was faster than every run without"
    assert f"reaches {mfus[plan]} MFU at this batch; with the buffer, {mfus[buffer]}." in flat
    allocated, reserved = peaks[buffer]
    device_gib = 139.8  # the H200 as torch reports it (docs/which-strategy.md, "as detected")
    assert f"{reserved:.1f} GiB of the {device_gib} was reserved, {reserved - allocated:.1f} GiB above" in flat
    assert f"{100 * (reserved - allocated) / device_gib:.1f}% of the device" in flat
    fragmentation = FITTED["ALLOCATOR_FRAGMENTATION"].value
    assert f"planner counts {100 * fragmentation:.0f}% of the device less its CUDA context" in flat
    assert f"the {100 * CHOICE_MARGIN:.0f}% margin" in flat
    summary = " ".join(docs.split())
    assert f"at {mfus[buffer]} (median of three runs)" in summary
    assert f"({mfus[buffer]} at 32, median of three runs)" in summary


def test_the_1b_gradient_placements_are_the_records() -> None:
    """docs/hugging-face.md's paragraph on the Llama 1B through both places for the offloaded gradients, from its
    records: the run's settings, losses, speeds, GPU memory and the strategy's own lines on the placement."""
    stem = REPOSITORY / "docs" / "results" / "2026-11-30-h200-hugging-face-1b-ds3-gradient-placement"
    docs = " ".join((REPOSITORY / "docs" / "hugging-face.md").read_text().split())
    flat = docs[docs.index("`deepspeed_stage_3` with part of the optimizer offloaded trains this Llama 1B") :]
    flat = flat[: flat.index("([measured at 13.1B]")]
    runs = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    lines = stem.with_suffix(".txt").read_text().splitlines()
    placements = ["offloaded_gradients_on_gpu", "offloaded_gradients_in_fp32"]  # the order the prose names them
    assert [[name for name in run["options"] if name.startswith("offloaded_")] for run in runs] == [
        [placement] for placement in placements
    ]
    assert f"with `{placements[0]}=True` or `{placements[1]}=True`" in flat
    (ratio,), (sub_group,) = (
        {run["options"]["offload_optimizer"] for run in runs},
        {run["options"]["sub_group_size"] for run in runs},
    )
    assert f"`offload_optimizer={ratio}, sub_group_size={sub_group:_}`" in flat
    (commit,), (date,) = {run["git_commit"] for run in runs}, {run["date"] for run in runs}
    assert f"{date}, commit {commit}" in flat and {run["device"] for run in runs} == {"NVIDIA H200"}
    ((steps, tokens, devices, size),) = {
        (run["steps"], run["tokens_per_step"], run["devices"], run["size"]) for run in runs
    }
    assert (devices, size) == (1, "1b") and f"One H200, from the config, {steps} steps of 4 x 2048 tokens" in flat
    assert tokens == 4 * 2048 and {run["source"] for run in runs} == {"from_config"}
    (first,) = {round(run["first_loss"], 2) for run in runs}
    (last,) = {round(run["last_loss"], 3) for run in runs}
    assert f"losses went from {first} to {last} both ways" in flat
    speeds = " and ".join(f"{run['tokens_per_second']:,}" for run in runs)
    reserved = " and ".join(f"{run['peak_gpu_reserved_gib']}" for run in runs)
    assert f"at {speeds} tokens/s, with {reserved} GiB of GPU memory reserved" in flat
    counts = (
        r"gradients: ([\d,]+) elements accumulate in fp32 beside their optimizer on cuda, ([\d,]+) {}.* all ([\d,]+)$"
    )
    on_gpu = re.fullmatch(
        f"{placements[0]}: ZeRO-3 " + counts.format("in a buffer of the working precision on cuda"), lines[0]
    )
    in_fp32 = re.fullmatch(
        f"{placements[1]}: ZeRO-3 " + counts.format(r"on the host \(in their fp32 gradients"), lines[1]
    )
    assert on_gpu and in_fp32 and on_gpu.groups() == in_fp32.groups() and len(lines) == 2
    kept, offloaded, whole = on_gpu.groups()
    assert sum(int(count.replace(",", "")) for count in (kept, offloaded)) == int(whole.replace(",", ""))
    assert f"The offloaded share, {offloaded} elements" in flat
