"""Runs the selected measurements one process (group) at a time and appends each result as it comes.

Results are written as they arrive, so a run cut short by a time limit still leaves everything
measured before it, and the summary says the set is incomplete. With repeats, every run is measured
several times, interleaved round by round, and the summary (and <label>.md) is rewritten after each
run with the medians, spreads and ratios so far.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.benchmark import environment, repeats
from tools.benchmark.catalogue import Run
from tools.benchmark.measure import Workload, classify_failure, describe
from tools.benchmark.sizes import SEARCH_ORDER

WORKER = Path(__file__).with_name("worker.py")
REPOSITORY = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Session:
    """Where one invocation writes: <out>/<label>.jsonl (one line per measurement) and <label>.summary.json."""

    out: Path
    label: str
    logs: Path
    timeout: float
    summary: dict[str, Any]
    checkpoint: bool = True  # each run saves a checkpoint after its last step
    checkpoint_root: Path | None = None  # where the per-run checkpoint folders go (default: the temporary folder)
    budget: float | None = None  # seconds for the whole session: no run starts that could not end within it
    began: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def results_path(self) -> Path:
        return self.out / f"{self.label}.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.out / f"{self.label}.summary.json"

    @property
    def table_path(self) -> Path:
        return self.out / f"{self.label}.md"

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def remaining(self) -> float:
        return float("inf") if self.budget is None else self.budget - self.elapsed()

    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.results_path.write_text("")
        self.summary["results_file"] = self.results_path.name
        self.summary["complete"] = False
        self.write_summary()

    def write_summary(self) -> None:
        # Written whole and then renamed: a kill while writing leaves the previous summary, never half of one.
        partial = self.summary_path.with_suffix(".partial")
        partial.write_text(json.dumps(self.summary, indent=2) + "\n")
        partial.replace(self.summary_path)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.results_path.read_text().splitlines() if line.strip()]

    def write_aggregate(self) -> None:
        """Medians, spreads and ratios of everything measured so far, in the summary and as <label>.md."""
        rows = repeats.aggregate(self.records())
        self.summary["repeated"] = rows
        self.write_summary()
        settings = json.dumps(self.summary["settings"])
        lines = [
            f"# {self.label}",
            "",
            f"{self.summary.get('device')}, settings {settings}",
            "",
            *repeats.table(rows),
            "",
        ]
        self.table_path.write_text("\n".join(lines))

    def append(self, record: dict[str, Any]) -> None:
        with self.results_path.open("a") as results:
            results.write(json.dumps(record) + "\n")
        shown = {
            key: record.get(key)
            for key in ("run", "repeat", "size", "devices", "status", "tokens_per_second", "checkpoint_seconds",
                        "wall_seconds")
        }  # fmt: skip
        if record.get("failure"):
            shown["reason"] = record["failure"]["reason"]
        print(json.dumps(shown), flush=True)

    def finish(self, **extra: Any) -> None:
        self.summary.update(extra, complete=True, finished=datetime.datetime.now().isoformat(timespec="seconds"))
        self.write_summary()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measure(
    session: Session, run: Run, workload: Workload, timeout: float | None = None, **extra: Any
) -> dict[str, Any]:
    """One measurement, in fresh processes; the record is appended to the session's results and returned."""
    record: dict[str, Any] = {
        "run": run.id,
        "kind": run.kind,
        "description": run.description,
        "precision": run.precision,
        "optimizer": run.optimizer,
        "partner": run.partner,
        "variant": run.variant,
        **describe(workload),
        **extra,
    }
    missing = run.missing()
    if missing:
        record.update(status="skipped", skip_reason=f"not installed: {', '.join(missing)}")
    elif workload.accelerator not in run.accelerators:
        record.update(status="skipped", skip_reason=f"runs on {'/'.join(run.accelerators)} only")
    else:
        record.update(launch(session, run, workload, session.timeout if timeout is None else timeout, extra))
    session.append(record)
    return record


def launch(
    session: Session, run: Run, workload: Workload, timeout: float, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="benchmark-") as scratch,
        tempfile.TemporaryDirectory(prefix="benchmark-checkpoint-", dir=session.checkpoint_root) as checkpoints,
    ):
        spec, result = Path(scratch, "spec.json"), Path(scratch, "result.json")
        if session.checkpoint:
            workload = dataclasses.replace(workload, checkpoint_dir=checkpoints)
        spec.write_text(json.dumps(dataclasses.asdict(workload)))
        repeat = f"-{extra['repeat']}" if extra and "repeat" in extra else ""
        name = run.id.replace(":", "-").replace("@", "-")
        log = session.logs / f"{name}-{workload.size}-{workload.devices}{repeat}.log"
        environment_variables = {
            **os.environ,
            "PYTHONPATH": environment.search_path(),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            **run.environment,
        }
        # Lightning starts the other ranks of a Trainer run itself; by-hand runs get one process per
        # rank with the variables torchrun would set.
        ranks = workload.devices if run.kind == "hand" else 1
        began = time.perf_counter()
        with log.open("w") as output:
            processes = []
            for rank in range(ranks):
                rank_environment = dict(environment_variables)
                if run.kind == "hand":
                    rank_environment.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks))
                processes.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), str(spec), str(result)],
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        env=rank_environment,
                        cwd=REPOSITORY,
                        start_new_session=True,  # its own process group: a timeout ends Lightning's ranks too
                    )
                )
            return_code, timed_out = wait_all(processes, timeout)
        wall = time.perf_counter() - began
        tail = log.read_text(errors="replace")[-4000:]
        if result.exists():
            outcome: dict[str, Any] = json.loads(result.read_text())
        else:
            reason = "timeout" if timed_out else classify_failure(tail, return_code)
            if timed_out and classify_failure(tail) != "other":
                reason = classify_failure(tail)  # a rank ran out of memory and the others waited for it
            outcome = {"status": "failed", "failure": {"reason": reason, "message": tail}}
        if outcome["status"] != "ok":
            outcome["failure"]["return_code"] = return_code
        outcome.update(wall_seconds=wall, log=str(log))
        return outcome


def wait_all(processes: list[subprocess.Popen[bytes]], timeout: float) -> tuple[int, bool]:
    """Wait for every rank; when one fails or time runs out, end the others' process groups (they
    would wait in a collective forever). Returns the first non-zero return code, and whether time ran out."""
    deadline = time.monotonic() + timeout
    first_failure = 0
    while True:
        codes = [process.poll() for process in processes]
        failed = [code for code in codes if code not in (None, 0)]
        if failed and not first_failure:
            first_failure = failed[0]
        if all(code is not None for code in codes):
            return first_failure, False
        if failed or time.monotonic() > deadline:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            return first_failure or 124, not failed
        time.sleep(0.5)


def run_all(
    session: Session,
    runs: list[Run],
    base: Workload,
    device_counts: list[int],
    repeat_count: Callable[[Run], int] = lambda run: 1,
) -> None:
    """Every run on every device count, each ``repeat_count(run)`` times, interleaved round by round.

    A run starts only when the session's budget leaves it the time it is expected to take (and it
    gets at most what is left), so a session with a budget ends by itself with whole runs."""
    by_id = {run.id: run for run in runs}
    order = repeats.schedule(list(by_id), lambda run_id: repeat_count(by_id[run_id]))
    records: list[dict[str, Any]] = []
    not_run: list[str] = []
    total = len(order) * len(device_counts)
    done = 0
    for devices in device_counts:
        for repeat, run_id in order:
            done += 1
            run = by_id[run_id]
            if session.remaining() < expected_seconds(records, run_id):
                not_run.append(f"{run_id} x{devices} repeat {repeat}")
                print(f"[{done}/{total}, {session.elapsed():.0f} s] budget: no time left for {run_id} repeat {repeat}",
                      flush=True)  # fmt: skip
                continue
            print(f"[{done}/{total}, {session.elapsed():.0f} s] {run_id} on {devices} device(s), repeat {repeat}",
                  flush=True)  # fmt: skip
            workload = dataclasses.replace(base, run=run.id, devices=devices)
            timeout = min(session.timeout, session.remaining())
            records.append(measure(session, run, workload, timeout=timeout, repeat=repeat))
            session.write_aggregate()
    session.finish(
        scaling=scaling(records) if len(device_counts) > 1 else None,
        counts=counts(records),
        not_run_for_budget=not_run,
    )
    print(session.table_path.read_text() if session.table_path.exists() else "", flush=True)


def expected_seconds(records: list[dict[str, Any]], run_id: str) -> float:
    """What the next repeat of ``run_id`` may take: its slowest earlier repeat, or before it has run the
    median of every run so far (a run cut by the budget would only be a failure in the results)."""
    walls = [record["wall_seconds"] for record in records if "wall_seconds" in record]
    own = [record["wall_seconds"] for record in records if record["run"] == run_id and "wall_seconds" in record]
    return max(own) if own else (statistics.median(walls) if walls else 1.0)


def scaling(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tokens/s on N devices over tokens/s on one, per run measured successfully at both (the last repeat)."""
    one = {r["run"]: r for r in records if r["devices"] == 1 and r["status"] == "ok"}
    rows = []
    for record in records:
        baseline = one.get(record["run"])
        if record["devices"] > 1 and record["status"] == "ok" and baseline:
            rows.append(
                {
                    "run": record["run"],
                    "devices": record["devices"],
                    "tokens_per_second": record["tokens_per_second"],
                    "tokens_per_second_one_device": baseline["tokens_per_second"],
                    "speedup": record["tokens_per_second"] / baseline["tokens_per_second"],
                }
            )
    return rows


def counts(records: list[dict[str, Any]]) -> dict[str, int]:
    result: dict[str, int] = {}
    for record in records:
        result[record["status"]] = result.get(record["status"], 0) + 1
    return result


def search_largest(session: Session, run: Run, base: Workload, start: str) -> None:
    """Walk up the sizes from ``start`` until one fails to train; record the largest that trained."""
    largest, failure = None, None
    records = []
    for size in SEARCH_ORDER[SEARCH_ORDER.index(start) :]:
        workload = dataclasses.replace(base, run=run.id, size=size)
        record = measure(session, run, workload, search=run.id)
        records.append(record)
        if record["status"] != "ok":
            if record["status"] == "failed":
                failure = {"size": size, "reason": record["failure"]["reason"]}
            break
        largest = size
    outcome = {"run": run.id, "largest_size": largest, "first_failure": failure}
    print(json.dumps({"search": outcome}), flush=True)
    session.finish(search=outcome, counts=counts(records))


def new_session(
    out: Path, label: str | None, logs: Path | None, timeout: float, settings: dict[str, Any], **options: Any
) -> Session:
    info = environment.collect()
    label = label or default_label(info, settings)
    summary = {"label": label, **info, "settings": settings, "command": sys.argv}
    logs = logs or Path(tempfile.gettempdir(), "benchmark-logs", label)
    return Session(out, label, logs, timeout, summary, **options)


def default_label(info: dict[str, Any], settings: dict[str, Any]) -> str:
    device = (info.get("device") or "cpu").replace("NVIDIA ", "").split()[0].lower()
    what = settings.get("preset") or (settings.get("search_largest") or "").replace(":", "-") or "custom"
    return f"{info['date']}-{device}-{what}-{settings['devices'][-1]}x"
