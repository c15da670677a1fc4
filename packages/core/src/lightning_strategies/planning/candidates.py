"""What a package's memory model answers with: a Prediction of one strategy name with settings, made into a
Candidate whose ``fits`` is judged alike for every package; the margin offload choices keep; the ranking."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import Any

from lightning_strategies.planning.fitted import FITTED, GIB
from lightning_strategies.planning.machine import Machine
from lightning_strategies.registry import get_registry

HOST_PROCESS_BASE_BYTES = int(FITTED["HOST_PROCESS_BASE_BYTES"].value)
EXPANDABLE_SEGMENTS_BELOW_BYTES = int(FITTED["EXPANDABLE_SEGMENTS_BELOW_BYTES"].value)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A memory model's prediction for one strategy name with ``settings`` (its constructor arguments).

    ``gpu_bytes`` is each device's ``torch.cuda.max_memory_allocated`` (0 for training on the CPU); ``host_bytes``
    the peak resident memory of all of one node's training processes together (``machine.processes_per_node``),
    with each process's set-up cost as the strategy has it (a whole copy of the model where it builds one,
    nothing where it builds on the meta device or partitioned); ``nvme_bytes`` what is offloaded to NVMe;
    ``offloaded_fraction`` the share of model-state bytes kept in host memory or on NVMe.
    """

    gpu_bytes: float
    host_bytes: float
    nvme_bytes: float = 0.0
    offloaded_fraction: float = 0.0
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Candidate:
    """One strategy name with settings, and what it would use.

    ``gpu_peak_gib`` is the predicted ``torch.cuda.max_memory_allocated`` of each device (0 on the CPU);
    ``host_peak_gib`` the predicted peak resident memory of all of one node's training processes together.
    ``offloaded_fraction`` is the share of model-state bytes (weights, gradients, optimizer states) kept in
    host memory or on NVMe. ``preference`` orders a package's own candidates of equal offload (lower runs
    faster, as far as its author knows).
    """

    strategy: str
    settings: dict[str, Any]
    gpu_peak_gib: float
    host_peak_gib: float
    fits: bool
    offloaded_fraction: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    preference: int = 0
    nvme_gib: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        for key in ("gpu_peak_gib", "host_peak_gib", "nvme_gib"):
            record[key] = round(record[key], 2)
        record["offloaded_fraction"] = round(self.offloaded_fraction, 3)
        return record

    def strategy_object(self, namespace: str = "lightning.pytorch", **overrides: Any) -> Any:
        """The strategy instance, ready for ``Trainer(strategy=...)`` (or Fabric, with that namespace); for Lightning's
        plain strategies, what the Trainer takes for them (``"auto"`` on one device)."""
        from lightning_strategies.planning import builtins

        settings = {**self.settings, **overrides}
        registry = get_registry()
        if self.strategy in builtins.NAMES and self.strategy not in registry:
            return builtins.strategy_object(self.strategy, settings, namespace)
        return registry.resolve(self.strategy, namespace=namespace, **settings)


def candidate(
    strategy: str,
    settings: dict[str, Any],
    gpu_peak_bytes: float,
    host_peak_bytes: float,
    machine: Machine,
    offloaded_fraction: float = 0.0,
    notes: Iterable[str] = (),
    preference: int = 0,
    nvme_bytes: float = 0.0,
) -> Candidate:
    """A Candidate from byte counts, with ``fits`` judged the same way for every package."""
    fits = fits_machine(gpu_peak_bytes, host_peak_bytes, machine, nvme_bytes)
    notes = list(notes)
    free = machine.gpu_memory_bytes - gpu_peak_bytes
    if fits and machine.gpus and free < EXPANDABLE_SEGMENTS_BELOW_BYTES and not expandable_segments_set():
        notes.append(
            f"leaves {free / GIB:.0f} GiB of each GPU free: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "before training starts, or fragmentation may run it out of memory"
        )
    return Candidate(
        strategy,
        dict(settings),
        gpu_peak_bytes / GIB,
        host_peak_bytes / GIB,
        fits,
        offloaded_fraction,
        notes,
        preference,
        nvme_bytes / GIB,
    )


def candidate_from(
    strategy: str, prediction: Prediction, machine: Machine, notes: Iterable[str] = (), preference: int = 0
) -> Candidate:
    """The Candidate of ``strategy`` with a package's ``prediction``: how every package answers the hook."""
    return candidate(
        strategy,
        prediction.settings,
        prediction.gpu_bytes,
        prediction.host_bytes,
        machine,
        prediction.offloaded_fraction,
        notes,
        preference,
        prediction.nvme_bytes,
    )


def expandable_segments_set() -> bool:
    """Whether this process's environment asks torch's allocator for expandable segments."""
    return "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()


def fits_machine(gpu_peak_bytes: float, host_peak_bytes: float, machine: Machine, nvme_bytes: float = 0.0) -> bool:
    """Whether the peaks fit each GPU and each node's host; without GPUs, only what trains on the CPU (no GPU
    peak) fits."""
    on_gpus = machine.gpus > 0 and gpu_peak_bytes <= machine.gpu_budget_bytes
    on_cpu = machine.gpus == 0 and gpu_peak_bytes == 0
    return (on_gpus or on_cpu) and host_peak_bytes <= machine.host_budget_bytes and nvme_bytes <= machine.nvme_bytes


def host_base_bytes(processes: int) -> int:
    """Resident memory of ``processes`` training processes before the model: one per GPU of the node."""
    return HOST_PROCESS_BASE_BYTES * max(1, processes)


# Processes a CPU candidate plans for where the machine has no GPU: the fewest over which a strategy shards.
CPU_PROCESSES = 2


def on_cpu(prediction: Prediction, processes: int) -> Prediction:
    """A GPU prediction for ``processes`` processes of one node, as training on the CPU: what each would hold on
    its device is held in host memory instead (gloo's buffers, smaller than NCCL's, are not counted)."""
    return dataclasses.replace(
        prediction, gpu_bytes=0.0, host_bytes=prediction.host_bytes + processes * prediction.gpu_bytes
    )


# The share of each GPU a package's memory model keeps free beyond its prediction when it chooses how much to
# offload, so that a prediction a little low still trains. One value for every package, so that their
# choices are equally cautious and the ranking compares like with like.
CHOICE_MARGIN = 0.05


def with_choice_margin(machine: Machine) -> Machine:
    """``machine`` with CHOICE_MARGIN less GPU memory: what to pass to ``smallest_fitting_fraction``."""
    return dataclasses.replace(machine, gpu_memory_bytes=int(machine.gpu_memory_bytes * (1 - CHOICE_MARGIN)))


def smallest_fitting_fraction(
    predict: Callable[[float], tuple[float, float]], machine: Machine, steps: int = 20
) -> float | None:
    """The smallest offload fraction (0, 1/steps, ..., 1) whose (GPU, host) peaks fit ``machine``.

    ``predict(fraction)`` returns the two peaks in bytes. Packages use this to choose Gemini's
    offload fractions or DeepSpeed's offload ratio; None when not even full offload fits.
    """
    for step in range(steps + 1):
        fraction = step / steps
        gpu, host = predict(fraction)
        if fits_machine(gpu, host, machine):
            return fraction
    return None


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Fitting first; then least offloaded (offloading costs step time); then the package's preference;
    then the smaller GPU peak (more room for a larger batch). On the CPU (no GPU peak) by host peak alone."""
    return sorted(
        candidates,
        key=lambda c: (
            not c.fits,
            round(c.offloaded_fraction, 3),
            c.host_peak_gib if c.gpu_peak_gib == 0 else 0.0,
            c.preference,
            c.gpu_peak_gib,
            c.strategy,
        ),
    )
