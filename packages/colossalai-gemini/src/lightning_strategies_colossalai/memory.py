"""Gemini's memory model for `lightning-strategies plan`: predicted peaks of its placements (arithmetic only:
no torch, no colossalai).

Gemini keeps each parameter in a low-precision chunk (its gradient is reduced into the same chunk), an fp32 master
chunk and HybridAdam's two fp32 moments: 2 + 4 + 8 = 14 bytes in bf16 with Adam, sharded over the GPUs. Static
placement offloads a share of the optimizer side (master and moments: offload_optim_frac) and, all or none, of the
low-precision chunks (offload_param_frac) to host memory.
"""

from __future__ import annotations

import dataclasses

from lightning_strategies.planning import (
    CHOICE_MARGIN,
    Candidate,
    Fitted,
    Machine,
    Prediction,
    Workload,
    activation_bytes,
    candidate_from,
    host_base_bytes,
    smallest_fitting_fraction,
    with_choice_margin,
)

# Low-precision chunks gathered at a time on each GPU, in blocks' worth: the block running and the next.
GATHERED_BLOCKS = 2
# The gradient of an offloaded chunk is copied to the host for HybridAdam's CPU update in 16 bits, and lives
# there until the next forward.
OFFLOADED_GRADIENT_BYTES = 2

# The model's fitted constants and the measurements they were checked against.
FITTED: dict[str, Fitted] = {
    "CPU_UPDATE_TEMPORARY_BYTES": Fitted(
        12,
        "fp32 temporaries per element of the tensor being updated when HybridAdam updates CPU-held chunks in bf16 "
        "through plain torch, one tensor at a time (read from ColossalAI 0.5's cpu_adam.py)",
        (
            "docs/results/2026-11-23-h200-memory-accuracy-1x.json",
            "docs/results/2026-11-24-h200-memory-accuracy-gemini-15b-1x.json",
        ),
    ),
    "AUTO_HOST_BYTES": Fitted(
        20,
        "host bytes per parameter planned for placement auto, which decides at run time: every state on the host "
        "plus a copy, since runs of it were killed for host memory after the traced first step",
        ("docs/which-strategy.md#the-largest-model-on-one-gpu",),
    ),
}
CPU_UPDATE_TEMPORARY_BYTES = FITTED["CPU_UPDATE_TEMPORARY_BYTES"].value
AUTO_HOST_BYTES = FITTED["AUTO_HOST_BYTES"].value


@dataclasses.dataclass(frozen=True)
class Placement:
    offload_optim_frac: float
    offload_param_frac: float


def predict_static(workload: Workload, gpus: int, placement: Placement, per_node: int | None = None) -> Prediction:
    """The peaks of a static placement, unpinned (the strategy's default): host memory holds only what is
    offloaded. The settings are the placement's, as the strategy takes them.

    The model is materialised on the GPU parameter by parameter (lazy init); without parameter offload every
    chunk, 16-bit and fp32, is closed there before the offloaded fp32 masters move to the host, so set-up
    briefly holds 6 bytes per parameter of the whole model on the GPUs; no process builds a copy on the host. Each
    node's host holds its ``per_node`` processes' (default: all) share of what is offloaded.
    """
    per_node = gpus if per_node is None else per_node
    count, shape = workload.parameters, workload.shape
    low = workload.low_precision_bytes
    optimizer_side = 4 + workload.optimizer_state_bytes
    total = count * (low + optimizer_side)
    on_host = count * (placement.offload_param_frac * low + placement.offload_optim_frac * optimizer_side)
    gathered = GATHERED_BLOCKS * shape.block_parameters() * low
    training = (total - on_host) / gpus + gathered + activation_bytes(workload)
    # GeminiDDP closes chunks on the GPU unless parameters are offloaded, then moves the offloaded fp32 masters.
    setup = count * (low + 4) / gpus if not placement.offload_param_frac else 0.0
    host = host_base_bytes(per_node) + on_host * per_node / gpus
    if placement.offload_optim_frac:
        # With parameter chunks offloaded too, the 16-bit chunk doubles as the gradient: counted twice, an
        # over-prediction of 2 bytes per parameter (colossalai_cpu in 2026-11-23-h200-memory-accuracy-1x.json).
        host += placement.offload_optim_frac * count * OFFLOADED_GRADIENT_BYTES * per_node / gpus
        if workload.precision == "bf16-mixed":
            largest = max(4 * shape.hidden * shape.hidden, shape.vocabulary * shape.hidden)
            host += per_node * CPU_UPDATE_TEMPORARY_BYTES * largest
    settings = {
        "placement_policy": "static",
        "offload_optim_frac": placement.offload_optim_frac,
        "offload_param_frac": placement.offload_param_frac,
    }
    return Prediction(max(training, setup), host, offloaded_fraction=on_host / total, settings=settings)


def predict_auto(workload: Workload, gpus: int, machine: Machine, per_node: int | None = None) -> Prediction:
    """Placement auto: chunks fill what the GPU has left after activations; the host is planned for all states
    (each node for its ``per_node`` processes' share)."""
    per_node = gpus if per_node is None else per_node
    count = workload.parameters
    low = workload.low_precision_bytes
    total = count * (low + 4 + workload.optimizer_state_bytes)
    room = max(0.0, machine.gpu_budget_bytes * (1 - CHOICE_MARGIN) - activation_bytes(workload))
    on_gpu = min(total / gpus, room)
    offloaded = 1 - on_gpu * gpus / total
    host = host_base_bytes(per_node) + AUTO_HOST_BYTES * count * per_node / gpus
    return Prediction(on_gpu + activation_bytes(workload), host, offloaded_fraction=offloaded)


def choose_static_placement(workload: Workload, machine: Machine) -> Placement | None:
    """The least share of the optimizer side to offload that fits with a margin. Parameter chunks are offloaded
    all or none by ColossalAI 0.5 (that is placement "cpu", planned on its own), so they are not a step here."""
    gpus, per_node = max(1, machine.gpus), machine.processes_per_node

    def optimizer_only(fraction: float) -> tuple[float, float]:
        prediction = predict_static(workload, gpus, Placement(fraction, 0.0), per_node)
        return prediction.gpu_bytes, prediction.host_bytes

    fraction = smallest_fitting_fraction(optimizer_only, with_choice_margin(machine))
    return None if fraction is None else Placement(fraction, 0.0)


def candidates(workload: Workload, machine: Machine) -> list[Candidate]:
    """The strategy's three named placements, and static placement with the least offload that fits where
    that is neither extreme."""
    if workload.precision not in ("16-mixed", "bf16-mixed") or machine.gpus == 0:
        return []  # Gemini trains in fp16 or bf16 only, on CUDA only
    gpus, per_node = max(1, machine.gpus), machine.processes_per_node
    found = []
    for name, placement, preference in (
        ("colossalai_cuda", Placement(0.0, 0.0), 0),
        ("colossalai_cpu", Placement(1.0, 1.0), 1),
    ):
        # The name sets the placement itself.
        named = dataclasses.replace(predict_static(workload, gpus, placement, per_node), settings={})
        found.append(candidate_from(name, named, machine, (), preference))
    auto = predict_auto(workload, gpus, machine, per_node)
    found.append(candidate_from("colossalai", auto, machine, ["placement decided at run time"], 2))
    chosen = choose_static_placement(workload, machine)
    if chosen is not None and 0 < chosen.offload_optim_frac < 1:
        static = predict_static(workload, gpus, chosen, per_node)
        found.append(candidate_from("colossalai", static, machine, (), 1))
    return found
