"""One rank of a two-process gloo group, made to fail in a chosen way (see test_ranks.py)."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from lightning_strategies.ranks import report_failure, watch_ranks

rank, port, scenario = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
watch_ranks(rank, 2)
dist.barrier()
failing = rank == int(os.environ.get("FAILING_RANK", "1"))
if failing and scenario == "raise":
    raise ValueError("training_step failed on purpose.")
if scenario == "both":  # the same deterministic error on every rank, a little apart in time
    time.sleep(0.1 * rank)
    raise ValueError("training_step failed on purpose.")
if failing and scenario == "report":  # what the Trainer's on_exception does before its teardown
    report_failure(ValueError("training_step failed on purpose"))
    time.sleep(600)
if failing and scenario == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if failing and scenario == "stop":  # alive but silent: no heartbeat, no exit
    os.kill(os.getpid(), signal.SIGSTOP)
if scenario == "clean":
    time.sleep(3 * rank)  # rank 1 outlives rank 0, whose process hosts the store
    print(f"rank {rank} finished")
    sys.exit(0)
dist.all_reduce(torch.ones(1))  # the survivor waits here for a peer that never comes
print(f"rank {rank} passed the all-reduce")
