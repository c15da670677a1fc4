"""What a plan says besides its ranking: what would fit when nothing does, and settings as text."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from lightning_strategies.planning import builtins
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
        f"{machine_text(machine)}."
    )
    if machine.gpus == 0 and not plan.suggestions:
        return text + (
            " No CUDA device was found here: pass --gpus N and --gpu-memory GiB (gpus= and gpu_memory_gib= from "
            "Python) to plan for the machine you will train on."
        )
    if not plan.candidates:
        return text + " No installed package answered: pip install a strategy package with a memory model."
    if plan.suggestions:
        return text + " What would: " + "; ".join(plan.suggestions) + "."
    text += (
        f" Nothing tried makes one fit: activation checkpointing with micro-batch 1, up to {MOST_NODES} nodes like "
        "this one, NVMe offloading."
    )
    if all(candidate.strategy in builtins.NAMES for candidate in plan.candidates):
        text += (
            " Only Lightning's own auto and ddp, which hold the whole model on each GPU, answered: a sharding "
            "strategy would spread it (pip install lightning-strategies-fsdp or lightning-strategies-deepspeed)."
        )
    return text


Ask = Callable[[Workload, Machine], list[Candidate]]


def machine_text(machine: Machine) -> str:
    """``8 node(s) x 8 GPU(s) of 80 GiB with 1024 GiB of host memory per node``, or the one node's, or its CPU."""
    host = f"{machine.host_memory_bytes / GIB:.0f} GiB of host memory"
    if machine.gpus == 0:
        return f"the CPU with {host}"
    gpus = f"GPU(s) of {machine.gpu_memory_bytes / GIB:.0f} GiB"
    if machine.nodes == 1:
        return f"{machine.gpus} {gpus} with {host}"
    return f"{machine.nodes} node(s) x {machine.gpus_per_node} {gpus} with {host} per node"


# How far the advice looks for more hardware: GPUs on one node, then nodes of the same kind.
MOST_GPUS_PER_NODE = 8
MOST_NODES = 128


def suggestions(workload: Workload, machine: Machine, ask: Ask) -> list[str]:
    """Changes to the workload or machine under which some candidate fits, each with the first that does.

    Tried one at a time, each as far as it must go: activation checkpointing, smaller micro-batches, more GPUs
    (on this node up to MOST_GPUS_PER_NODE, then more nodes like it, each with its own host memory), NVMe space
    for offloading. Where none alone is enough, all of them together, with the fewest nodes that then fit.
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
    if machine.gpus == 0:
        return found  # training on the CPU: no GPUs or NVMe offload to add
    more = more_hardware(workload, machine, first_fit) if machine.gpu_memory_bytes > 0 else None
    if more:
        found.append(more)
    elif found and not workload.activation_checkpointing:
        # Checkpointing alone fits, perhaps only by offloading: the fewest nodes on which it trains without.
        trial = dataclasses.replace(workload, activation_checkpointing=True)
        if nodes := fewest_nodes(trial, machine, first_fit, without_offload=True):
            count, best = nodes
            found.append(
                f"activation checkpointing on {count} nodes like this one, {count * machine.gpus_per_node} GPUs in "
                f"all, without offloading ({best.strategy} {settings_text(best)}; pass --nodes {count} "
                f"--gpus-per-node {machine.gpus_per_node})"
            )
    if machine.nvme_bytes == 0 and (best := first_fit(workload, dataclasses.replace(machine, nvme_bytes=1 << 50))):
        found.append(nvme_text(best))
    if not found:
        found.extend(all_together(workload, machine, first_fit))
    return found


def more_hardware(workload: Workload, machine: Machine, first_fit: Callable[..., Candidate | None]) -> str | None:
    """The fewest GPUs of this kind that fit: more on this node (a single node, up to MOST_GPUS_PER_NODE), else
    more nodes like this one, each bringing its own host memory."""
    if machine.nodes == 1:
        gpus = machine.gpus + 1
        while gpus <= MOST_GPUS_PER_NODE:
            if best := first_fit(workload, dataclasses.replace(machine, gpus=gpus)):
                return f"{gpus} GPUs of this kind on this node ({best.strategy} {settings_text(best)})"
            gpus += 1
    if (nodes := fewest_nodes(workload, machine, first_fit)) is not None:
        count, best = nodes
        return (
            f"{count} nodes like this one, {count * machine.gpus_per_node} GPUs in all ({best.strategy} "
            f"{settings_text(best)}; pass --nodes {count} --gpus-per-node {machine.gpus_per_node})"
        )
    return None


def fewest_nodes(
    workload: Workload, machine: Machine, first_fit: Callable[..., Candidate | None], without_offload: bool = False
) -> tuple[int, Candidate] | None:
    """The fewest nodes like this one's (up to MOST_NODES) on which some candidate fits (one that offloads
    nothing, ``without_offload``), and the best of it."""
    per_node = machine.gpus_per_node
    for nodes in range(machine.nodes + 1, MOST_NODES + 1):
        best = first_fit(workload, dataclasses.replace(machine, gpus=nodes * per_node, nodes=nodes))
        if best and not (without_offload and best.offloaded_fraction > 0):
            return nodes, best
    return None


def nvme_text(best: Candidate) -> str:
    return (
        f"NVMe offloading with at least {math.ceil(best.nvme_gib)} GiB free per node ({best.strategy} "
        f"{settings_text(best)}; pass --nvme GiB)"
    )


def all_together(workload: Workload, machine: Machine, first_fit: Callable[..., Candidate | None]) -> list[str]:
    """Where no change alone fits: activation checkpointing and micro-batch 1, with NVMe offloading or the fewest
    nodes like this one."""
    trial = dataclasses.replace(workload, activation_checkpointing=True, micro_batch=1)
    together = "activation checkpointing and micro-batch 1"
    if best := first_fit(trial, machine):
        return [f"{together} ({best.strategy} {settings_text(best)})"]
    found = []
    if machine.nvme_bytes == 0 and (best := first_fit(trial, dataclasses.replace(machine, nvme_bytes=1 << 50))):
        found.append(f"{together} with {nvme_text(best)}")
    if (nodes := fewest_nodes(trial, machine, first_fit)) is not None:
        count, best = nodes
        found.append(
            f"{together} on {count} nodes like this one ({best.strategy} {settings_text(best)}; pass --nodes "
            f"{count} --gpus-per-node {machine.gpus_per_node})"
        )
    return found


def settings_text(candidate: Candidate) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in candidate.settings.items()) or "defaults"
