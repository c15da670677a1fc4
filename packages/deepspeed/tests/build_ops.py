"""Builds the DeepSpeed ops the CPU tier loads into TORCH_EXTENSIONS_DIR, before the tests run.

The tests' runs would build them on first use in any case, in the same folder and the same way (DeepSpeed's own
builders for its CPU accelerator, through torch's JIT); the nox session runs this as part of its installation
instead, about four minutes on two cores that the session's tests no longer wait for (.ci/run installs the
next session while one session's tests run). An op that cannot be built here (async I/O without libaio) is
left to the tests, which then fail with what to install.

    python packages/deepspeed/tests/build_ops.py
"""

from __future__ import annotations

import os
import sys
import time

# Only the ops of a CPU run: the shared-memory collectives every DeepSpeed process group on CPU loads,
# DeepSpeedCPUAdam (optimizer offload), and the async I/O op NVMe offload swaps through.
OPS = ("ShareMemCommBuilder", "CPUAdamBuilder", "AsyncIOBuilder")


def main() -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        print("TORCH_EXTENSIONS_DIR is not set: nothing would reuse the ops built here.", file=sys.stderr)
        return 2
    from deepspeed.accelerator import get_accelerator

    for name in OPS:
        builder = get_accelerator().create_op_builder(name)
        if not builder.is_compatible(verbose=False):
            print(f"{builder.NAME}: not buildable here, left to the tests", flush=True)
            continue
        started = time.monotonic()
        builder.load(verbose=False)
        print(f"{builder.NAME}: ready in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
