"""FSDP2's memory model for `lightning-strategies plan`: predicted peaks of each fsdp name, per GPU and per node.

Arithmetic only (no torch). FSDP2 keeps every parameter as an fp32 shard with its fp32 gradient shard
and optimizer moments; in forward and backward the blocks are gathered one or two at a time in the
compute precision (MixedPrecisionPolicy). CPUOffloadPolicy moves the shards, gradients and moments to
host memory, leaving only gathered blocks and activations on the GPU. Without GPUs, fsdp and fsdp_cpu_offload
train on the CPU over gloo.
"""

from __future__ import annotations

from typing import Any

from lightning_strategies.planning import (
    CPU_PROCESSES,
    Candidate,
    Fitted,
    Machine,
    Prediction,
    Workload,
    activation_bytes,
    candidate_from,
    host_base_bytes,
    on_cpu,
)

# Blocks gathered at a time: the one running and the one prefetched.
GATHERED_BLOCKS = 2

# The model's fitted constants and the measurements they were checked against.
FITTED: dict[str, Fitted] = {
    "OFFLOAD_HOST_OVERHEAD_BYTES": Fitted(
        2,
        "host bytes per parameter beyond the states with CPUOffloadPolicy: pinned staging copies of the gathered "
        "low-precision weights and of the gradients coming back",
        ("docs/results/2026-11-23-h200-memory-accuracy-1x.json",),
    ),
}
OFFLOAD_HOST_OVERHEAD_BYTES = FITTED["OFFLOAD_HOST_OVERHEAD_BYTES"].value


def _states_per_parameter(workload: Workload) -> int:
    """fp32 weights and gradients (the sharded originals) and the optimizer's moments."""
    return 4 + 4 + workload.optimizer_state_bytes


def predict(workload: Workload, gpus: int, name: str, per_node: int | None = None) -> Prediction:
    """The peaks of an fsdp name on ``gpus`` GPUs, ``per_node`` of them (default: all) on each node."""
    per_node = gpus if per_node is None else per_node
    count, shape = workload.parameters, workload.shape
    compute_bytes = workload.low_precision_bytes
    states = count * _states_per_parameter(workload)
    shards = 1 if name == "fsdp_no_shard" else gpus
    # The root's own parameters (embeddings, head) stay gathered from forward until its backward.
    root = 2 * shape.vocabulary * shape.hidden + workload.sequence_length * shape.hidden
    block = shape.block_parameters()
    if name == "fsdp_shard_grad_op":
        gathered = count * compute_bytes  # reshard_after_forward=False: every block stays gathered
    else:
        gathered = (GATHERED_BLOCKS * block + root) * compute_bytes
    # A block's unsharded gradient before it is reduce-scattered, in fp32.
    unsharded_gradient = block * 4
    offloading = name == "fsdp_cpu_offload"
    gpu_states = 0.0 if offloading else states / shards
    gpu = gpu_states + gathered + unsharded_gradient + activation_bytes(workload)
    # configure_model builds on the meta device and each shard is allocated where it trains, so no process holds
    # the whole model on the host (docs/results/2026-11-27-h200x4-hugging-face-8b.jsonl). Offloading keeps the
    # states in host memory: each node its own processes' shards.
    offloaded = (states + OFFLOAD_HOST_OVERHEAD_BYTES * count) * per_node / gpus if offloading else 0.0
    host = host_base_bytes(per_node) + offloaded
    settings, _ = NAMES[name]
    return Prediction(gpu, host, offloaded_fraction=1.0 if offloading else 0.0, settings=dict(settings))


# name -> (constructor settings, preference among equal offload)
NAMES: dict[str, tuple[dict[str, Any], int]] = {
    "fsdp": ({}, 0),
    "fsdp_shard_grad_op": ({}, 1),
    "fsdp_no_shard": ({}, 2),
    "fsdp_cpu_offload": ({}, 0),
}


def candidates(workload: Workload, machine: Machine) -> list[Candidate]:
    if machine.gpus == 0:
        return cpu_candidates(workload, machine)
    gpus = max(1, machine.gpus)
    found = []
    for name, (_, preference) in NAMES.items():
        if name == "fsdp_no_shard" and gpus == 1:
            continue  # the same as fsdp on one GPU
        notes = []
        if workload.activation_checkpointing:
            notes.append("pass activation_checkpointing_policy={YourBlock} for the checkpointing planned here")
        prediction = predict(workload, gpus, name, machine.processes_per_node)
        found.append(candidate_from(name, prediction, machine, notes, preference))
    return found


def cpu_candidates(workload: Workload, machine: Machine) -> list[Candidate]:
    """fsdp on the CPU over gloo, CPU_PROCESSES processes sharding the states (fsdp_cpu_offload is the same there)."""
    cpu = on_cpu(predict(workload, CPU_PROCESSES, "fsdp"), CPU_PROCESSES)
    note = f"on the CPU over gloo: Trainer(accelerator='cpu', devices={CPU_PROCESSES})"
    return [candidate_from("fsdp", cpu, machine, [note], 0)]
