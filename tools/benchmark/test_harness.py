"""CPU tests of the benchmark harness: the tiny GPT trained for real (PyTorch, FSDP2 by hand and
Trainer(strategy="fsdp") over gloo, on one and two processes), failures recorded, the report written.

    python -m pytest tools/benchmark/test_harness.py     (needs torch, lightning and lightning-strategies-fsdp;
                                                          matplotlib for the report test)
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY))

from tools.benchmark.catalogue import PRESETS, RUNS  # noqa: E402
from tools.benchmark.measure import classify_failure, peak_bf16_flops  # noqa: E402
from tools.benchmark.model import GPT, parameter_count, training_flops_per_token  # noqa: E402
from tools.benchmark.sizes import SIZES  # noqa: E402

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
                          "--logs", str(out / "logs"))  # fmt: skip
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


def test_report_without_results_says_none_were_measured(tmp_path: Path) -> None:
    from tools.benchmark import report

    page = tmp_path / "benchmarks.md"
    report.write(tmp_path / "results", page)
    assert "No results have been measured yet" in page.read_text()
    assert "tokens/s |" not in page.read_text()


def test_a_crashing_run_becomes_a_recorded_failure(tmp_path: Path) -> None:
    # A batch of zero sequences makes the DataLoader raise inside the worker process.
    arguments = [*TINY]
    arguments[arguments.index("--batch-size") + 1] = "0"
    completed = benchmark("run", "--runs", "hand:torch", "--out", str(tmp_path), "--label", "crash", *arguments)
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
        assert set(run_ids) <= set(RUNS)
    assert all(RUNS[run].partner in (None, *RUNS) for run in RUNS)
