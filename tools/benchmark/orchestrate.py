"""Runs the selected measurements one process (group) at a time and appends each result as it comes.

Results are written as they arrive, so a run cut short by a time limit still leaves everything
measured before it, and the summary says the set is incomplete.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.benchmark import environment
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

    @property
    def results_path(self) -> Path:
        return self.out / f"{self.label}.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.out / f"{self.label}.summary.json"

    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.results_path.write_text("")
        self.summary["results_file"] = self.results_path.name
        self.summary["complete"] = False
        self.write_summary()

    def write_summary(self) -> None:
        self.summary_path.write_text(json.dumps(self.summary, indent=2) + "\n")

    def append(self, record: dict[str, Any]) -> None:
        with self.results_path.open("a") as results:
            results.write(json.dumps(record) + "\n")
        shown = {key: record.get(key) for key in ("run", "size", "devices", "status", "tokens_per_second", "mfu")}
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


def measure(session: Session, run: Run, workload: Workload, **extra: Any) -> dict[str, Any]:
    """One measurement, in fresh processes; the record is appended to the session's results and returned."""
    record: dict[str, Any] = {
        "run": run.id,
        "kind": run.kind,
        "description": run.description,
        "precision": run.precision,
        "optimizer": run.optimizer,
        "partner": run.partner,
        **describe(workload),
        **extra,
    }
    missing = run.missing()
    if missing:
        record.update(status="skipped", skip_reason=f"not installed: {', '.join(missing)}")
    elif workload.accelerator not in run.accelerators:
        record.update(status="skipped", skip_reason=f"runs on {'/'.join(run.accelerators)} only")
    else:
        record.update(launch(session, run, workload))
    session.append(record)
    return record


def launch(session: Session, run: Run, workload: Workload) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="benchmark-") as scratch:
        spec, result = Path(scratch, "spec.json"), Path(scratch, "result.json")
        spec.write_text(json.dumps(dataclasses.asdict(workload)))
        log = session.logs / f"{run.id.replace(':', '-')}-{workload.size}-{workload.devices}.log"
        environment_variables = {
            **os.environ,
            "PYTHONPATH": environment.search_path(),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
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
            return_code, timed_out = wait_all(processes, session.timeout)
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


def run_all(session: Session, runs: list[Run], base: Workload, device_counts: list[int]) -> None:
    records = []
    for devices in device_counts:
        for run in runs:
            workload = dataclasses.replace(base, run=run.id, devices=devices)
            records.append(measure(session, run, workload))
    session.finish(scaling=scaling(records) if len(device_counts) > 1 else None, counts=counts(records))


def scaling(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tokens/s on N devices over tokens/s on one, per run measured successfully at both."""
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


def new_session(out: Path, label: str | None, logs: Path | None, timeout: float, settings: dict[str, Any]) -> Session:
    info = environment.collect()
    label = label or default_label(info, settings)
    summary = {"label": label, **info, "settings": settings, "command": sys.argv}
    return Session(out, label, logs or Path(tempfile.gettempdir(), "benchmark-logs", label), timeout, summary)


def default_label(info: dict[str, Any], settings: dict[str, Any]) -> str:
    device = (info.get("device") or "cpu").replace("NVIDIA ", "").split()[0].lower()
    what = settings.get("preset") or settings.get("search_largest", "").replace(":", "-") or "custom"
    return f"{info['date']}-{device}-{what}-{settings['devices'][-1]}x"
