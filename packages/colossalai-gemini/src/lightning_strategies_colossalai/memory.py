"""Gemini's memory: the statistics of a run (what the old ZeRO API reported, read from ColossalAI 0.5) and
the memory model `lightning-strategies plan` predicts placements with (arithmetic only, at the end).

Model data is what the chunks hold (fp16/bf16 parameters, fp32 master weights, gradients).
Non-model data (activations, workspace) is measured by Gemini's memory tracer during the
warm-up iteration of the "auto" placement, the only policy that traces. Optimizer bytes are
the fp32 master weights and the Adam moments, split by the device that holds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from lightning_strategies.planning import Candidate, Machine, Workload

PREFIX = "colossalai/"


def _device_kind(device: torch.device | str) -> str:
    kind = torch.device(device).type
    return "cpu" if kind == "cpu" else "cuda"


def model_data_bytes(gemini_model: Any) -> dict[str, int]:
    """Bytes of chunk memory on each device, from the chunk manager's own bookkeeping."""
    total = gemini_model.chunk_manager.total_mem
    return {"cuda": int(total.get("cuda", 0)), "cpu": int(total.get("cpu", 0))}


def non_model_data_peak_bytes(gemini_model: Any) -> int | None:
    """Peak CUDA non-model data seen by the memory tracer; None where nothing was traced."""
    manager = gemini_model.gemini_manager
    if not manager.need_warmup or manager.is_warmup():
        return None
    samples = manager.memstats().non_model_data_list("cuda")
    return int(max(samples)) if samples else None


def optimizer_bytes(gemini_optimizer: Any) -> dict[str, int]:
    """Bytes held for the optimizer: fp32 master chunks plus every state tensor, by device."""
    usage = {"cuda": 0, "cpu": 0}
    for chunk16 in gemini_optimizer.chunk16_set:
        master = chunk16.paired_chunk
        if master is not None and master is not chunk16:
            usage[_device_kind(master.device_type)] += int(master.payload_mem)
    for state in gemini_optimizer.optim.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                usage[_device_kind(value.device)] += value.numel() * value.element_size()
    return usage


def memory_statistics(gemini_model: Any, gemini_optimizer: Any | None = None) -> dict[str, float]:
    """The statistics as flat metric names (bytes), ready for ``logger.log_metrics``."""
    stats: dict[str, float] = {}
    for device, value in model_data_bytes(gemini_model).items():
        stats[f"{PREFIX}model_data_{device}_bytes"] = value
    peak = non_model_data_peak_bytes(gemini_model)
    if peak is not None:
        stats[f"{PREFIX}non_model_data_cuda_peak_bytes"] = peak
    if gemini_optimizer is not None:
        for device, value in optimizer_bytes(gemini_optimizer).items():
            stats[f"{PREFIX}optimizer_{device}_bytes"] = value
    return stats


def log_memory_statistics(trainer: Any, is_global_zero: bool, statistics: Callable[[], dict[str, float]]) -> None:
    """Send rank 0's statistics to the Trainer's loggers at the Trainer's logging cadence (``log_every_n_steps``),
    as Lightning logs its own metrics; they are computed only on the steps that log them."""
    if trainer is None or not trainer.loggers or not is_global_zero:
        return
    if trainer.global_step % max(1, trainer.log_every_n_steps) != 0:
        return
    stats = statistics()
    for logger in trainer.loggers:
        logger.log_metrics(stats, step=trainer.global_step)


# The memory model. Gemini keeps each parameter in a low-precision chunk (its gradient is reduced into the
# same chunk), an fp32 master chunk and HybridAdam's two fp32 moments: 2 + 4 + 8 = 14 bytes in bf16 with
# Adam, sharded over the GPUs. Static placement offloads a share of the optimizer side (master and
# moments: offload_optim_frac) and, all or none, of the low-precision chunks (offload_param_frac) to host memory.

# Low-precision chunks gathered at a time on each GPU, in blocks' worth: the block running and the next.
GATHERED_BLOCKS = 2
# The gradient of an offloaded chunk is copied to the host for HybridAdam's CPU update (16-bit: 2 bytes) and
# lives there until the next forward.
OFFLOADED_GRADIENT_BYTES = 2
# With bf16, HybridAdam updates CPU-held chunks through plain torch, one tensor at a time, with fp32 temporaries
# of about 12 bytes per element of the tensor being updated (ColossalAI 0.5's cpu_adam.py).
CPU_UPDATE_TEMPORARY_BYTES = 12
# Placement "auto" decides at run time; after the traced first step 6.7B and 13B were killed for host memory
# with 55 and 89 GiB of the GPU in use (pinned, ColossalAI's default then), so its host peak is planned as every
# state on the host plus a copy. An estimate, to be fitted.
AUTO_HOST_BYTES = 20


@dataclasses.dataclass(frozen=True)
class Placement:
    offload_optim_frac: float
    offload_param_frac: float


def predict_static(workload: Workload, gpus: int, placement: Placement) -> tuple[float, float, float]:
    """(GPU peak per device, host peak of the node, share of model states offloaded) of a static placement,
    unpinned (the strategy's default): host memory holds only what is offloaded.

    The model is materialised on the GPU parameter by parameter (lazy init); without parameter offload every
    chunk, 16-bit and fp32, is closed there before the offloaded fp32 masters move to the host, so set-up
    briefly holds 6 bytes per parameter of the whole model on the GPUs.
    """
    from lightning_strategies.planning import activation_bytes, host_base_bytes

    count, shape = workload.parameters, workload.shape
    low = workload.low_precision_bytes
    optimizer_side = 4 + workload.optimizer_state_bytes
    total = count * (low + optimizer_side)
    on_host = count * (placement.offload_param_frac * low + placement.offload_optim_frac * optimizer_side)
    gathered = GATHERED_BLOCKS * shape.block_parameters() * low
    training = (total - on_host) / gpus + gathered + activation_bytes(workload)
    # GeminiDDP closes chunks on the GPU unless parameters are offloaded, then moves the offloaded fp32 masters.
    setup = count * (low + 4) / gpus if not placement.offload_param_frac else 0.0
    host = host_base_bytes(gpus) + on_host
    if placement.offload_optim_frac:
        # With parameter chunks offloaded too, the 16-bit chunk doubles as the gradient: counted twice, an
        # over-prediction of 2 bytes per parameter (colossalai_cpu of 2.7B: 44.8 GiB predicted, 43.7 measured).
        host += placement.offload_optim_frac * count * OFFLOADED_GRADIENT_BYTES
        if workload.precision == "bf16-mixed":
            largest = max(4 * shape.hidden * shape.hidden, shape.vocabulary * shape.hidden)
            host += gpus * CPU_UPDATE_TEMPORARY_BYTES * largest
    return max(training, setup), host, on_host / total


def predict_auto(workload: Workload, gpus: int, machine: Machine) -> tuple[float, float, float]:
    """Placement auto: chunks fill what the GPU has left after activations; the host is planned for all states."""
    from lightning_strategies.planning import CHOICE_MARGIN, activation_bytes, host_base_bytes

    count = workload.parameters
    low = workload.low_precision_bytes
    total = count * (low + 4 + workload.optimizer_state_bytes)
    room = max(0.0, machine.gpu_budget_bytes * (1 - CHOICE_MARGIN) - activation_bytes(workload))
    on_gpu = min(total / gpus, room)
    offloaded = 1 - on_gpu * gpus / total
    host = host_base_bytes(gpus) + AUTO_HOST_BYTES * count
    return on_gpu + activation_bytes(workload), host, offloaded


def choose_static_placement(workload: Workload, machine: Machine) -> Placement | None:
    """The least share of the optimizer side to offload that fits with a margin. Parameter chunks are offloaded
    all or none by ColossalAI 0.5 (that is placement "cpu", planned on its own), so they are not a step here."""
    from lightning_strategies.planning import smallest_fitting_fraction, with_choice_margin

    gpus = max(1, machine.gpus)

    def optimizer_only(fraction: float) -> tuple[float, float]:
        return predict_static(workload, gpus, Placement(fraction, 0.0))[:2]

    fraction = smallest_fitting_fraction(optimizer_only, with_choice_margin(machine))
    return None if fraction is None else Placement(fraction, 0.0)


def plan_candidates(workload: Workload, machine: Machine) -> list[Candidate]:
    """The strategy's three named placements, and static placement with the least offload that fits where
    that is neither extreme."""
    from lightning_strategies.planning import candidate

    if workload.precision not in ("16-mixed", "bf16-mixed"):
        return []  # Gemini trains in fp16 or bf16 only
    gpus = max(1, machine.gpus)
    found = []
    for name, placement, preference in (
        ("colossalai_cuda", Placement(0.0, 0.0), 0),
        ("colossalai_cpu", Placement(1.0, 1.0), 1),
    ):
        gpu, host, offloaded = predict_static(workload, gpus, placement)
        found.append(candidate(name, {}, gpu, host, machine, offloaded, (), preference))
    gpu, host, offloaded = predict_auto(workload, gpus, machine)
    auto = candidate("colossalai", {}, gpu, host, machine, offloaded, ["placement decided at run time"], 2)
    found.append(auto)
    chosen = choose_static_placement(workload, machine)
    if chosen is not None and 0 < chosen.offload_optim_frac < 1:
        settings = {
            "placement_policy": "static",
            "offload_optim_frac": chosen.offload_optim_frac,
            "offload_param_frac": chosen.offload_param_frac,
        }
        gpu, host, offloaded = predict_static(workload, gpus, chosen)
        found.append(candidate("colossalai", settings, gpu, host, machine, offloaded, (), 1))
    return found
