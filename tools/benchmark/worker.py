"""One measurement in its own process: ``python tools/benchmark/worker.py SPEC.json RESULT.json``.

A fresh process per run gives each a clean GPU and allocator; a crash or an out-of-memory error
ends only this process, and the harness records it. Lightning may start more copies of this
process (one per device); only global rank 0 writes the result.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before the heavy imports: setup time includes importing the backend

import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tools.benchmark


def main() -> int:
    from tools.benchmark.catalogue import resolve
    from tools.benchmark.measure import Workload, classify_failure, rank

    spec_path, result_path = sys.argv[1], sys.argv[2]
    workload = Workload(**json.loads(Path(spec_path).read_text()))
    run = resolve([workload.run])[0]
    try:
        if run.kind == "hand":
            from tools.benchmark import hand_runs as runs
        else:
            from tools.benchmark import lightning_runs as runs  # type: ignore[no-redef]
        result = runs.measure(workload, run, STARTED)
    except BaseException as error:
        message = "".join(traceback.format_exception(error))
        print(message, file=sys.stderr, flush=True)
        if rank() == 0:
            failure = {"reason": classify_failure(message), "message": message[-4000:]}
            Path(result_path).write_text(json.dumps({"status": "failed", "failure": failure}))
        return 1
    if result is not None:
        if result["finite_loss"]:
            record = {"status": "ok", **result}
        else:
            failure = {"reason": "nonfinite_loss", "message": f"losses: {result['losses']}"}
            record = {"status": "failed", "failure": failure, **result}
        Path(result_path).write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
