"""The environment for launching a fresh group of ranks from a process that may have trained before, and the
reports its ranks write.

Lightning writes the rendezvous of a run into ``os.environ`` (``MASTER_PORT`` and friends) and
keeps the process group, with its store listening on that port, until the process exits. A child
launched afterwards with the same environment reuses the port for its own store and fails with
EADDRINUSE (seen on two H200s, 2026-11-22: every two-GPU test that followed a one-GPU test in the
same pytest process). A new group needs a new rendezvous.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["end_process_group", "fresh_launch_environment", "rank_report_files"]

# Set by Lightning's launchers and torchrun for one run; never meaningful to a new group of ranks.
RENDEZVOUS_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
)


def fresh_launch_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without a previous run's rendezvous, plus ``extra``."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in RENDEZVOUS_VARIABLES and not key.startswith("TORCHELASTIC_")
    }
    environment.update(extra or {})
    return environment


def end_process_group() -> None:
    """Shut this rank's process group down before the interpreter exits: call it last in a script every rank runs.

    Left to interpreter exit, gloo's worker threads can still hold work while Python tears down, which aborts the
    process ("terminate called without an active exception", SIGABRT) after a run that succeeded. Trainers, engines
    and device meshes still alive in reference cycles hold the group's communicators, so they are collected first,
    while the group can still be shut down in order.
    """
    import torch.distributed as dist

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_report_files(folder: Path) -> list[Path]:
    """The ``report.rank<N>.json`` files in ``folder``, ordered by rank as a number: rank10 comes after rank9."""
    return sorted(folder.glob("report.rank*.json"), key=lambda file: int(file.stem.removeprefix("report.rank")))
