"""What a plan says besides its ranking: what would fit when nothing does, and settings as text."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from lightning_strategies.planning.candidates import Candidate, rank
from lightning_strategies.planning.fitted import GIB
from lightning_strategies.planning.machine import Machine
from lightning_strategies.planning.workload import Workload

if TYPE_CHECKING:
    from lightning_strategies.planning.planner import Plan


def nothing_fits_message(plan: Plan) -> str:
    workload, machine = plan.workload, plan.machine
    text = (
        f"No installed strategy fits {workload.parameters / 1e9:.2f}B parameters "
        f"(micro-batch {workload.micro_batch} x {workload.sequence_length} tokens, {workload.precision}) on "
        f"{machine.gpus} GPU(s) of {machine.gpu_memory_bytes / GIB:.0f} GiB with {machine.host_memory_bytes / GIB:.0f} "
        "GiB of host memory."
    )
    if machine.gpus == 0:
        return text + (
            " No CUDA device was found here: pass --gpus N and --gpu-memory GiB (gpus= and gpu_memory_gib= from "
            "Python) to plan for the machine you will train on."
        )
    if not plan.candidates:
        return text + " No installed package answered: pip install a strategy package with a memory model."
    if plan.suggestions:
        text += " What would: " + "; ".join(plan.suggestions) + "."
    return text


Ask = Callable[[Workload, Machine], list[Candidate]]


def suggestions(workload: Workload, machine: Machine, ask: Ask) -> list[str]:
    """Changes to the workload or machine under which some candidate fits, each with the first that does.

    Tried one at a time, each as far as it must go: activation checkpointing, smaller micro-batches,
    more GPUs (up to 64), NVMe space for offloading.
    """

    def first_fit(trial_workload: Workload, trial_machine: Machine) -> Candidate | None:
        fitting = [c for c in ask(trial_workload, trial_machine) if c.fits]
        return rank(fitting)[0] if fitting else None

    found = []
    if not workload.activation_checkpointing:
        trial = dataclasses.replace(workload, activation_checkpointing=True)
        if best := first_fit(trial, machine):
            found.append(f"activation checkpointing ({best.strategy} {settings_text(best)})")
    micro_batch = workload.micro_batch // 2
    while micro_batch >= 1:
        trial = dataclasses.replace(workload, micro_batch=micro_batch)
        if best := first_fit(trial, machine):
            found.append(f"micro-batch {micro_batch} ({best.strategy} {settings_text(best)})")
            break
        micro_batch //= 2
    if machine.gpu_memory_bytes > 0:
        gpus = max(1, machine.gpus) * 2
        while gpus <= 64:
            # More GPUs of the same kind; host memory grows with them only when they are on other nodes,
            # which the planner does not model, so it stays the node's.
            if best := first_fit(workload, dataclasses.replace(machine, gpus=gpus)):
                found.append(f"{gpus} GPUs of this kind ({best.strategy} {settings_text(best)})")
                break
            gpus *= 2
    if machine.nvme_bytes == 0:
        trial_machine = dataclasses.replace(machine, nvme_bytes=1 << 50)
        if best := first_fit(workload, trial_machine):
            found.append(
                f"NVMe offloading with at least {math.ceil(best.nvme_gib)} GiB free ({best.strategy} "
                f"{settings_text(best)}; pass --nvme GiB)"
            )
    return found


def settings_text(candidate: Candidate) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in candidate.settings.items()) or "defaults"
