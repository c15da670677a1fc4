"""Lightning's own plain strategies as plan candidates: one device (``auto``, Lightning's SingleDeviceStrategy)
and ``ddp``, wherever the whole model and its optimizer fit on each GPU, so that a small model gets the plain
answer before any sharding. No package of ours registers these names, so core predicts them.

Arithmetic only. Each GPU holds the whole model as torch keeps it: weights and gradients in their stored
precision (fp32 under a mixed precision), the optimizer's moments, under autocast a low-precision copy of the
weights, and with ``ddp`` its gradient buckets, a second copy of the gradients. Each process builds the model
on the host before moving it (a whole copy per process: nothing is on the meta device), and Lightning's teardown
moves the module and the optimizer's state back there after fit. On a machine without GPUs, ``auto`` (one process)
and ``ddp`` (CPU_PROCESSES processes) train on the CPU, everything in host memory.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_strategies.planning.candidates import (
    CPU_PROCESSES,
    Candidate,
    Prediction,
    candidate_from,
    host_base_bytes,
    on_cpu,
)
from lightning_strategies.planning.machine import Machine
from lightning_strategies.planning.workload import Workload, activation_bytes

# Lightning's names for the plain strategies, as Trainer(strategy=...) takes them.
SINGLE_DEVICE = "auto"
DDP = "ddp"
NAMES = (SINGLE_DEVICE, DDP)
# Ahead of any sharded or offloaded candidate that also fits: no gathering, no offload, the fewest collectives.
PREFERENCE = -1


def stored_bytes(workload: Workload) -> int:
    """Bytes of a weight (and of its gradient) as torch stores it: fp32 under a mixed precision."""
    return 4 if workload.mixed else workload.low_precision_bytes


def predict(workload: Workload, gpus: int, name: str, per_node: int | None = None) -> Prediction:
    """The peaks of ``auto`` on one GPU or ``ddp`` on ``gpus`` GPUs, ``per_node`` of them (default: all) on each
    node."""
    per_node = gpus if per_node is None else per_node
    count = workload.parameters
    stored = stored_bytes(workload)
    per_parameter = 2 * stored + workload.optimizer_state_bytes
    if workload.mixed:
        per_parameter += workload.low_precision_bytes  # autocast's cached copy of the weights
    if name == DDP:
        per_parameter += stored  # DDP's gradient buckets beside the gradients
    gpu = count * per_parameter + activation_bytes(workload)
    # Built whole on the host in every process; after fit the module and the optimizer's state come back there.
    host = host_base_bytes(per_node) + per_node * count * (stored + workload.optimizer_state_bytes)
    return Prediction(gpu, host)


def candidates(workload: Workload, machine: Machine, registry: Any) -> list[Candidate]:
    """``auto`` on one GPU, ``ddp`` on several; without GPUs both on the CPU; none for a name a plugin has taken
    over."""
    if machine.gpus == 0:
        return cpu_candidates(workload, machine, registry)
    name = SINGLE_DEVICE if machine.gpus == 1 else DDP
    if name in registry:
        return []
    where = "one device (Lightning's SingleDeviceStrategy)" if name == SINGLE_DEVICE else "each GPU"
    notes = [f"Lightning's own strategy: the model and its optimizer whole on {where}"]
    prediction = predict(workload, machine.gpus, name, machine.processes_per_node)
    return [candidate_from(name, prediction, machine, notes, PREFERENCE)]


def cpu_candidates(workload: Workload, machine: Machine, registry: Any) -> list[Candidate]:
    """``auto`` (one process) and ``ddp`` (CPU_PROCESSES processes) training on the CPU."""
    found = []
    for name, processes in ((SINGLE_DEVICE, 1), (DDP, CPU_PROCESSES)):
        if name in registry:
            continue
        cpu = on_cpu(predict(workload, processes, name), processes)
        note = f"Lightning's own strategy on the CPU: Trainer(accelerator='cpu', devices={processes})"
        found.append(candidate_from(name, cpu, machine, [note], PREFERENCE))
    return found


def strategy_object(name: str, settings: dict[str, Any], namespace: str) -> Any:
    """What ``Trainer(strategy=...)`` (or Fabric, with that namespace) takes for a plain candidate: ``"auto"``,
    or Lightning's DDPStrategy."""
    if name == SINGLE_DEVICE:
        return SINGLE_DEVICE
    return importlib.import_module(f"{namespace}.strategies").DDPStrategy(**settings)
