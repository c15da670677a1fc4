"""Lightning's own plain strategies as plan candidates: one device (``auto``, Lightning's SingleDeviceStrategy)
and ``ddp``, wherever the whole model and its optimizer fit on each GPU, so that a small model gets the plain
answer before any sharding. No package of ours registers these names, so core predicts them.

Arithmetic only. Each GPU holds the whole model as torch keeps it: weights and gradients in their stored
precision (fp32 under a mixed precision), the optimizer's moments, under autocast a low-precision copy of the
weights, and with ``ddp`` its gradient buckets, a second copy of the gradients. Each process builds the model
on the host before moving it, and Lightning's teardown moves the module and the optimizer's state back there
after fit.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_strategies.planning.candidates import Candidate, Prediction, candidate_from, host_base_bytes
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


def predict(workload: Workload, gpus: int, name: str) -> Prediction:
    """The peaks of ``auto`` on one GPU or ``ddp`` on ``gpus`` GPUs of one node."""
    count = workload.parameters
    stored = stored_bytes(workload)
    per_parameter = 2 * stored + workload.optimizer_state_bytes
    if workload.mixed:
        per_parameter += workload.low_precision_bytes  # autocast's cached copy of the weights
    if name == DDP:
        per_parameter += stored  # DDP's gradient buckets beside the gradients
    gpu = count * per_parameter + activation_bytes(workload)
    # Built on the host in every process; after fit the module and the optimizer's state come back there.
    host = host_base_bytes(gpus) + gpus * count * (stored + workload.optimizer_state_bytes)
    return Prediction(gpu, host)


def candidates(workload: Workload, machine: Machine, registry: Any) -> list[Candidate]:
    """``auto`` on one GPU, ``ddp`` on several; none for a name a plugin has taken over."""
    name = SINGLE_DEVICE if machine.gpus == 1 else DDP
    if machine.gpus < 1 or name in registry:
        return []
    where = "one device (Lightning's SingleDeviceStrategy)" if name == SINGLE_DEVICE else "each GPU"
    notes = [f"Lightning's own strategy: the model and its optimizer whole on {where}"]
    return [candidate_from(name, predict(workload, machine.gpus, name), machine, notes, PREFERENCE)]


def strategy_object(name: str, settings: dict[str, Any], namespace: str) -> Any:
    """What ``Trainer(strategy=...)`` (or Fabric, with that namespace) takes for a plain candidate: ``"auto"``,
    or Lightning's DDPStrategy."""
    if name == SINGLE_DEVICE:
        return SINGLE_DEVICE
    return importlib.import_module(f"{namespace}.strategies").DDPStrategy(**settings)
