"""DeepSpeed's memory model for `lightning-strategies plan`: predicted peaks of ZeRO stages 1-3, with the
optimizer offloaded in part (ZeRO-3's offload ratio) or whole, and parameters offloaded only when needed.

Arithmetic only: no torch, no deepspeed. Per GPU: the partitions of the model states ZeRO keeps there,
DeepSpeed's communication buffers and the activations, at backward's start or at the optimizer step. Per
node, for its processes together: their share of what offloading keeps in host memory, and what passes through
it during set-up and when Lightning's teardown moves the module and optimizer to the CPU after fit. Stages 1 and
2 build the whole model in each process; ZeRO-3 builds it partitioned (zero.Init), though a 16-bit copy was
measured passing through each process's host memory at set-up. Without GPUs, ZeRO-2 and ZeRO-3 train on the CPU
(DeepSpeed's CPU accelerator over gloo).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from lightning_strategies.planning import (
    CHOICE_MARGIN,
    CPU_PROCESSES,
    GIB,
    Candidate,
    Fitted,
    Machine,
    Prediction,
    Workload,
    activation_bytes,
    candidate_from,
    host_base_bytes,
    on_cpu,
    smallest_fitting_fraction,
    with_choice_margin,
)
from lightning_strategies_deepspeed.defaults import DEFAULTS, IN_FP32, ON_GPU

# DeepSpeed's own defaults for settings our strategy does not expose (elements, not bytes).
STAGE3_PREFETCH_BUCKET_ELEMENTS = 50_000_000
# DeepSpeed's tuning guide: with overlap_comm, ZeRO-1/2 hold about 4.5 times the bucket sizes.
OVERLAP_COMM_BUCKET_FACTOR = 4.5

# The model's fitted constants and the measurements they came from.
FITTED: dict[str, Fitted] = {
    "OFFLOAD_HOST_OVERHEAD_BYTES": Fitted(
        3,
        "host bytes per offloaded parameter beyond its states (pinned staging buffers, CPU Adam's copies, a 16-bit "
        "gradient slot) where parameters are offloaded too or below ZeRO-3",
        ("docs/results/2026-11-23-h200-memory-accuracy-1x.json",),
    ),
    "OPTIMIZER_OFFLOAD_STAGING_BYTES": Fitted(
        0.25,
        "the same for ZeRO-3's optimizer offload with the parameters on the GPU, its gradient slots counted apart "
        "(host_gradient_slots)",
        (
            "docs/results/2026-11-23-h100-memory-accuracy-ds-search-1x.json",
            "docs/results/2026-11-23-h200-memory-accuracy-ds-12b-1x.json",
            "docs/results/2026-11-23-h200-memory-accuracy-ds-gradients-1x.json",
            "docs/results/2026-11-24-h200-memory-accuracy-ds-13b-fp32-1x.json",
        ),
    ),
    "ZERO3_SETUP_HOST_BYTES": Fitted(
        2,
        "host bytes per parameter of its partition in each process while ZeRO-3 without parameter offload sets up: "
        "DeepSpeed defragments the 16-bit partition through a host buffer (runtime/zero/utils.py, defragment), freed "
        "before training",
        (
            "docs/results/2026-11-23-h200-memory-accuracy-1x.json",
            "docs/results/2026-11-28-h200x4-memory-accuracy.json",
        ),
    ),
}
OFFLOAD_HOST_OVERHEAD_BYTES = FITTED["OFFLOAD_HOST_OVERHEAD_BYTES"].value
OPTIMIZER_OFFLOAD_STAGING_BYTES = FITTED["OPTIMIZER_OFFLOAD_STAGING_BYTES"].value
ZERO3_SETUP_HOST_BYTES = FITTED["ZERO3_SETUP_HOST_BYTES"].value
# An fp32 gradient: CPU Adam reads each offloaded parameter's in host memory, and with a share offloaded each
# GPU-held sub-group keeps one standing on the GPU; without offload ZeRO-3's step makes one sub-group's at a time.
FP32_GRADIENT_BYTES = 4


@dataclasses.dataclass(frozen=True)
class ZeroSetting:
    stage: int
    optimizer_offload: float = 0.0  # the share of optimizer states in host memory (1.0: all)
    offload_parameters: bool = False
    nvme: bool = False


def predict(
    workload: Workload,
    gpus: int,
    setting: ZeroSetting,
    parameters: dict[str, Any] | None = None,
    per_node: int | None = None,
) -> Prediction:
    """Peaks of one ZeRO setting for ``workload`` on ``gpus`` GPUs, ``per_node`` of them (default: all) on each
    node, with the strategy's ``parameters`` (the settings of the prediction)."""
    per_node = gpus if per_node is None else per_node
    node_share = per_node / gpus  # of the partitions, those of this node's processes
    options = {**DEFAULTS, **(parameters or {})}
    count, states, shape = workload.parameters, workload.state_bytes(), workload.shape
    ratio, stage = setting.optimizer_offload, setting.stage
    per_rank = count / gpus
    kept_in_fp32 = stage == 3 and ratio > 0
    if kept_in_fp32:
        # ZeRO-3 places whole sub-groups: what is offloaded is DeepSpeed's rounding of the ratio, not the ratio.
        ratio = 1 - gpu_share(ratio, partition_sizes(workload, gpus), options["sub_group_size"])

    weights = count * states.weights / (gpus if stage == 3 else 1)
    if setting.offload_parameters:
        weights = 0.0
    # Gradients are partitioned from stage 2 on; the offloaded share of a partition goes to the host in fp32.
    gradients = count * states.gradients / (gpus if stage >= 2 else 1)
    gradients *= 1 - ratio if stage >= 2 else 1
    optimizer_side = per_rank * states.optimizer_side if stage >= 1 else count * states.optimizer_side
    gpu_optimizer = optimizer_side * (1 - ratio)
    if kept_in_fp32:
        # ZeRO-3 with an optimizer offload gives each GPU-held sub-group a standing fp32 gradient, into which
        # backward accumulates (gradient_buffers.py); with offloaded_gradients_on_gpu the offloaded share
        # accumulates beside it in the working precision.
        gradients = per_rank * FP32_GRADIENT_BYTES * (1 - ratio)
        if options[ON_GPU] and not workload.precision.startswith("16"):
            gradients += per_rank * states.gradients * ratio

    largest_module = max(shape.block_parameters(), shape.vocabulary * shape.hidden)
    step_buffers = 0.0
    if stage == 3:
        # Parameters gathered for the module being run, the next one being prefetched, and the reduce bucket.
        gathered = (2 * largest_module + STAGE3_PREFETCH_BUCKET_ELEMENTS) * states.weights
        buffers = gathered + options["reduce_bucket_size"] * states.gradients * (2 if options["overlap_comm"] else 1)
        # Without offload the step makes fp32 gradients for one sub-group of the GPU's partition at a time.
        step_buffers = 0.0 if kept_in_fp32 else min(options["sub_group_size"], per_rank) * FP32_GRADIENT_BYTES
    elif stage >= 1:
        factor = OVERLAP_COMM_BUCKET_FACTOR if options["overlap_comm"] else 1.0
        buckets = max(options["reduce_bucket_size"], options["allgather_bucket_size"])
        buffers = buckets * states.gradients * factor
    else:
        buffers = 0.0
    # Two moments hold the peak: backward's start, with every activation alive, and the optimizer step, with
    # the activations freed. ZeRO-3 allocates its gradient partition up front; ZeRO-1/2 fill theirs during
    # backward while the activations are freed (ds2 and ds3 in 2026-11-23-h200-memory-accuracy-1x.json).
    backward_gradients = gradients if stage == 3 else 0.0
    backward = weights + backward_gradients + gpu_optimizer + buffers + activation_bytes(workload)
    step = weights + gradients + gpu_optimizer + step_buffers
    gpu = max(backward, step)

    offloaded_states = ratio * count * (states.optimizer_side + FP32_GRADIENT_BYTES)
    offloaded_weights = count * states.weights if setting.offload_parameters else 0.0
    offloaded = offloaded_states + offloaded_weights
    if stage == 3 and ratio > 0 and not setting.offload_parameters:
        overhead = OPTIMIZER_OFFLOAD_STAGING_BYTES * ratio * count + host_gradient_slots(workload, ratio, options)
    else:
        overhead = OFFLOAD_HOST_OVERHEAD_BYTES * count * (ratio if not setting.offload_parameters else 1.0)
    host_states = 0.0 if setting.nvme else (offloaded + overhead) * node_share
    if stage == 3 and 0 < ratio < 1 and not setting.nvme:
        # With any optimizer offload ZeRO-3 allocates a gradient slot on the host for every parameter at set-up;
        # the strategy replaces it (gradient_buffers.py) before CPU Adam's moments arrive with the first step
        # (docs/results/2026-11-23-h200-memory-accuracy-ds-gradients-1x.json; DeepSpeed's buffer kept:
        # 2026-11-23-h200-memory-accuracy-largest-1x.json).
        setup = ratio * count * (states.master + FP32_GRADIENT_BYTES) + states.gradients * count
        host_states = max(host_states, setup * node_share)
    if stage == 3 and not setting.offload_parameters:
        # Set-up passes each process's 16-bit partition through host memory (on 4 x H200 at 20B: 9.7 GiB a rank).
        host_states = max(host_states, node_share * count * ZERO3_SETUP_HOST_BYTES)
    nvme = offloaded * node_share if setting.nvme else 0.0
    # After fit, Lightning's Strategy.teardown (which DeepSpeed's strategies keep) moves the module and the
    # optimizer's state to the CPU. Below ZeRO-3 the module's 16-bit weights come along, on top of whatever the
    # host already holds (stage 3's module holds placeholders).
    module = 0.0 if stage == 3 or setting.offload_parameters else per_node * count * states.weights
    if ratio == 0 and not setting.offload_parameters:
        # Without optimizer offload every rank's Adam moments move too (2026-11-23-h200-memory-accuracy-1x.json
        # and -2x.json). With a share offloaded resident memory did not grow after the last step (the 45% run in
        # -1x.json): the state Lightning moves is then CPU Adam's, already on the host. So a small offload can
        # lower the host peak: one measurement says so, and the planner follows it.
        moments = count * states.optimizer * node_share if stage >= 1 else per_node * count * states.optimizer
        host_states = max(host_states, moments + module)
    else:
        host_states += module
    host = host_base_bytes(per_node) + host_states
    moved = ratio * count * states.optimizer_side + offloaded_weights + (ratio * count * states.gradients)
    return Prediction(gpu, host, nvme, min(1.0, moved / (count * states.total)), dict(parameters or {}))


def host_gradient_slots(workload: Workload, ratio: float, options: dict[str, Any]) -> float:
    """Bytes of ZeRO-3's host gradient slots with ``ratio`` of the optimizer offloaded (gradient_buffers.py): one
    of the working precision per offloaded parameter; none with offloaded_gradients_in_fp32 or _on_gpu; with fp16,
    whose overflow check reads DeepSpeed's own buffer, DeepSpeed's slot for every parameter."""
    if workload.precision.startswith("16"):
        return workload.parameters * workload.state_bytes().gradients
    if options[IN_FP32] or options[ON_GPU]:
        return 0.0
    return ratio * workload.parameters * workload.state_bytes().gradients


# The plan's sub-group size: a PARTIAL_OFFLOAD_SUB_GROUPS-th of a partition. DeepSpeed closes a sub-group at the
# first tensor that takes it to this size, so a GPT's partition makes fewer (17 to 19 from 2.7B to 13B, 11 to 16
# below, where the head is a large share), and the ratio acts in uneven steps.
PARTIAL_OFFLOAD_SUB_GROUPS = 20


def partition_sizes(workload: Workload, gpus: int) -> list[float]:
    """Elements of each parameter tensor's partition on one of ``gpus`` processes, in module order, scaled to the
    workload's parameter count where that was given apart from the shape."""
    sizes = workload.shape.tensor_sizes(workload.sequence_length)
    scale = workload.parameters / sum(sizes)
    return [size * scale / gpus for size in sizes]


def sub_groups(sizes: list[float], sub_group_size: float) -> list[float]:
    """Elements of each sub-group as DeepSpeed's ZeRO-3 makes them: tensors in order, a sub-group closed at the
    tensor that brings it to ``sub_group_size`` or more (one sub-group when the partition is no larger)."""
    if sub_group_size >= sum(sizes):
        return [sum(sizes)]
    groups, current = [], 0.0
    for size in sizes:
        current += size
        if current >= sub_group_size:
            groups.append(current)
            current = 0.0
    return [*groups, current] if current else groups


def gpu_share(ratio: float, sizes: list[float], sub_group_size: float) -> float:
    """The share of a process's partition whose optimizer DeepSpeed keeps on the GPU for an offload ``ratio``:
    the first ``int((1 - ratio) * sub-groups)`` sub-groups, as its ZeRO-3 optimizer places them (with one
    sub-group, DeepSpeed's default size, nothing stays)."""
    groups = sub_groups(sizes, sub_group_size)
    return sum(groups[: int((1 - ratio) * len(groups))]) / sum(groups)


def partial_offload_sub_group_size(workload: Workload, gpus: int) -> int:
    """The sub-group size the plan sets with a partial offload: a PARTIAL_OFFLOAD_SUB_GROUPS-th of a partition."""
    return max(1, math.ceil(workload.parameters / gpus / PARTIAL_OFFLOAD_SUB_GROUPS))


def _settings(setting: ZeroSetting, workload: Workload, gpus: int, gradients: str | None = None) -> dict[str, Any]:
    settings: dict[str, Any] = {"stage": setting.stage}
    if setting.optimizer_offload >= 1:
        settings["offload_optimizer"] = True
    elif setting.optimizer_offload > 0:
        settings["offload_optimizer"] = round(setting.optimizer_offload, 3)
        settings["sub_group_size"] = partial_offload_sub_group_size(workload, gpus)
    if setting.offload_parameters:
        settings["offload_parameters"] = True
    if setting.nvme:
        settings.update(remote_device="nvme", offload_params_device="nvme", offload_optimizer_device="nvme")
    if gradients:
        settings[gradients] = True
    return settings


def _candidate(
    name: str,
    workload: Workload,
    machine: Machine,
    setting: ZeroSetting,
    preference: int,
    gradients: str | None = None,
) -> Candidate:
    gpus = max(1, machine.gpus)
    chosen = _settings(setting, workload, gpus, gradients)
    # With the sub-groups the settings ask for.
    prediction = predict(workload, gpus, setting, chosen, machine.processes_per_node)
    notes = []
    if 0 < setting.optimizer_offload < 1:
        share = 1 - gpu_share(setting.optimizer_offload, partition_sizes(workload, gpus), chosen["sub_group_size"])
        notes.append(f"offloads {share:.0%} of the optimizer states: the ratio, in DeepSpeed's whole sub-groups")
    return candidate_from(name, prediction, machine, notes, preference)


def partial_prediction(workload: Workload, machine: Machine, ratio: float, gradients: str | None = None) -> Prediction:
    """ZeRO-3 with ``ratio`` of the optimizer offloaded, with the plan's settings for it (its sub-groups, and
    ``gradients``, where the offloaded share's gradients accumulate), on ``machine``."""
    gpus, setting = max(1, machine.gpus), ZeroSetting(3, ratio)
    chosen = _settings(setting, workload, gpus, gradients)
    return predict(workload, gpus, setting, chosen, machine.processes_per_node)


def choose_offload_ratio(workload: Workload, machine: Machine, gradients: str | None = None) -> float | None:
    """The least share of optimizer states ZeRO-3 must offload for the GPU peak to fit with a margin."""

    def peaks(ratio: float) -> tuple[float, float]:
        prediction = partial_prediction(workload, machine, ratio, gradients)
        return prediction.gpu_bytes, prediction.host_bytes

    return smallest_fitting_fraction(peaks, with_choice_margin(machine))


def candidates(workload: Workload, machine: Machine) -> list[Candidate]:
    """One candidate per useful setting: no offload (stages 2 and 3), the least optimizer offload that fits,
    full offload, parameters offloaded too, and NVMe. Without GPUs, ZeRO-2 and ZeRO-3 on the CPU."""
    if machine.gpus == 0:
        return cpu_candidates(workload, machine)
    found = [
        _candidate("deepspeed_stage_2", workload, machine, ZeroSetting(2), 0),
        _candidate("deepspeed_stage_3", workload, machine, ZeroSetting(3), 1),
        _candidate("deepspeed_stage_2_offload", workload, machine, ZeroSetting(2, 1.0), 1),
    ]
    gradients, ratio, buffered = partial_offload(workload, machine)
    if ratio is not None and 0 < ratio < 1:
        partial = _candidate("deepspeed_stage_3", workload, machine, ZeroSetting(3, ratio), 0, gradients)
        if gradients != ON_GPU and not workload.precision.startswith("16"):
            partial.notes.append(gradient_buffer_note(workload, machine, ratio, buffered))
        found.append(partial)
    full, full_in_fp32 = (
        _candidate("deepspeed_stage_3", workload, machine, ZeroSetting(3, 1.0), 2, option) for option in (None, IN_FP32)
    )
    found.append(full_in_fp32 if full_in_fp32.fits and not full.fits else full)
    # Parameters go to the host only when the optimizer's whole share there is not enough.
    found.append(_candidate("deepspeed_stage_3_offload", workload, machine, ZeroSetting(3, 1.0, True), 3))
    found.append(
        _candidate("deepspeed_stage_3_offload_nvme", workload, machine, ZeroSetting(3, 1.0, True, nvme=True), 4)
    )
    return found


def partial_offload(workload: Workload, machine: Machine) -> tuple[str | None, float | None, float | None]:
    """Where the offloaded share's gradients accumulate, the least share to offload with it, and the least share
    with them on the GPU (None where none fits, or with fp16).

    On the GPU where that needs no larger share than the host would: one copy to the host an optimizer step
    instead of two every micro-batch, and no host slot. Else in host slots of the working precision; and in the
    fp32 gradients (twice the PCIe traffic of 16-bit slots) only where the host needs the bytes that saves. With
    fp16 DeepSpeed's own slots stay (its overflow check reads them), and neither setting applies.
    """
    gradients, ratio = None, choose_offload_ratio(workload, machine)
    if workload.precision.startswith("16"):
        return gradients, ratio, None
    if ratio is None:
        gradients, ratio = IN_FP32, choose_offload_ratio(workload, machine, IN_FP32)
    on_gpu = choose_offload_ratio(workload, machine, ON_GPU)
    if on_gpu is not None and ratio is not None and on_gpu <= ratio:
        return ON_GPU, on_gpu, on_gpu
    return gradients, ratio, on_gpu


def gradient_buffer_note(workload: Workload, machine: Machine, ratio: float, buffered: float | None) -> str:
    """Where the plan left out the GPU buffer for the offloaded share's gradients at its share ``ratio``: what the
    buffer is for, and what it would take (``buffered``, the least share at which it fits the plan's margin, or
    its peak at the plan's share)."""
    what = (
        f"{ON_GPU}=True keeps the offloaded share's gradients on the GPU until the optimizer step instead of "
        "sending them to the host every micro-batch (docs: Which strategy?, DeepSpeed's offload ratio)"
    )
    if buffered is not None and buffered < 1:
        peaks = partial_prediction(workload, machine, buffered, ON_GPU)
        return (
            f"{what}; with it the plan would offload more, offload_optimizer={peaks.settings['offload_optimizer']} "
            f"(sub_group_size={peaks.settings['sub_group_size']}): {peaks.gpu_bytes / GIB:.1f} GiB of each GPU, "
            f"{peaks.host_bytes / GIB:.1f} GiB of host memory"
        )
    gpu_bytes = partial_prediction(workload, machine, ratio, ON_GPU).gpu_bytes
    within = with_choice_margin(machine).gpu_budget_bytes
    return (
        f"{what}; at this share it predicts {gpu_bytes / GIB:.1f} GiB of each GPU, above the {within / GIB:.1f} GiB "
        f"the plan chooses within ({CHOICE_MARGIN:.0%} less than the {machine.gpu_budget_bytes / GIB:.1f} GiB it "
        "counts as usable), and no larger share fits it"
    )


def cpu_candidates(workload: Workload, machine: Machine) -> list[Candidate]:
    """ZeRO-2 and ZeRO-3 on the CPU over gloo, CPU_PROCESSES processes, everything in host memory."""
    note = f"on the CPU (DeepSpeed's CPU accelerator, gloo): Trainer(accelerator='cpu', devices={CPU_PROCESSES})"
    found = []
    for name, stage in (("deepspeed_stage_2", 2), ("deepspeed_stage_3", 3)):
        setting = ZeroSetting(stage)
        chosen = _settings(setting, workload, CPU_PROCESSES)
        cpu = on_cpu(predict(workload, CPU_PROCESSES, setting, chosen), CPU_PROCESSES)
        found.append(candidate_from(name, cpu, machine, [note], stage - 2))
    return found
