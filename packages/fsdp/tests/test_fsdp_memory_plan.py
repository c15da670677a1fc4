"""FSDP2's memory model for `lightning-strategies plan`: sharding divides model states, offloading moves them."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_strategies.planning import (
    GIB,
    Machine,
    Workload,
    activation_bytes,
    host_base_bytes,
    plan,
    unfound_evidence,
)
from lightning_strategies_fsdp.memory import FITTED, candidates, predict


def test_sharding_divides_sixteen_bytes_per_parameter_over_the_gpus():
    workload = Workload.build("1B")
    one = predict(workload, 1, "fsdp").gpu_bytes
    four = predict(workload, 4, "fsdp").gpu_bytes
    assert one - four == pytest.approx(16 * workload.parameters * 3 / 4, rel=0.001)
    replicas = predict(workload, 4, "fsdp_no_shard").gpu_bytes
    assert replicas == pytest.approx(one, rel=0.001)


def test_cpu_offload_moves_the_states_to_the_host():
    workload = Workload.build("1B")
    plain, offloading = predict(workload, 1, "fsdp"), predict(workload, 1, "fsdp_cpu_offload")
    gpu, host, offloaded = plain.gpu_bytes, plain.host_bytes, plain.offloaded_fraction
    offloaded_gpu, offloaded_host, fraction = offloading.gpu_bytes, offloading.host_bytes, offloading.offloaded_fraction
    assert (offloaded, fraction) == (0.0, 1.0)
    assert gpu - offloaded_gpu == pytest.approx(16 * workload.parameters, rel=0.001)
    # Offloading keeps all 16 bytes of each parameter's states in host memory.
    assert offloaded_host - host >= 16 * workload.parameters
    assert offloaded_gpu > activation_bytes(workload)  # gathered blocks and activations stay on the GPU


def test_no_process_holds_the_whole_model_on_the_host():
    """configure_model builds on the meta device: a process adds its base memory, not a copy of the model."""
    workload = Workload.build("70B")
    one = predict(workload, 1, "fsdp").host_bytes
    eight = predict(workload, 8, "fsdp").host_bytes
    assert eight - one < 4 * workload.parameters / 8
    assert one < 4 * workload.parameters / 8


def test_shard_grad_op_keeps_every_block_gathered():
    workload = Workload.build("1B")
    assert predict(workload, 4, "fsdp_shard_grad_op").gpu_bytes > predict(workload, 4, "fsdp").gpu_bytes + GIB


def test_plan_ranks_the_installed_fsdp_names():
    machine = Machine(gpus=1, gpu_memory_bytes=80 * GIB, host_memory_bytes=100 * GIB)
    names = {c.strategy for c in candidates(Workload.build("1B"), machine)}
    assert names == {"fsdp", "fsdp_shard_grad_op", "fsdp_cpu_offload"}  # no_shard is fsdp on one GPU
    result = plan("1B", gpus=1, gpu_memory_gib=80, host_memory_gib=100)
    fsdp = [c for c in result.candidates if c.strategy.startswith("fsdp")]
    assert fsdp and fsdp[0].strategy == "fsdp" and fsdp[0].fits
    assert type(fsdp[0].strategy_object()).__name__ == "FSDP2Strategy"


def test_every_fitted_constant_points_at_evidence_that_exists():
    repository = Path(__file__).resolve().parents[3]
    assert unfound_evidence(FITTED, repository) == []


def test_each_node_holds_only_its_processes_shards_and_bases():
    """Over nodes, a node's host holds its own processes' base memory and, offloading, their shards alone."""
    workload = Workload.build("70B")
    one_node = predict(workload, 64, "fsdp_cpu_offload")
    eight_nodes = predict(workload, 64, "fsdp_cpu_offload", per_node=8)
    assert eight_nodes.gpu_bytes == one_node.gpu_bytes
    assert eight_nodes.host_bytes < one_node.host_bytes / 7
    assert predict(workload, 64, "fsdp", per_node=8).host_bytes == host_base_bytes(8)  # meta device: no copy


def test_without_gpus_fsdp_trains_on_the_cpu():
    machine = Machine(gpus=0, gpu_memory_bytes=0, host_memory_bytes=64 * GIB)
    (cpu,) = candidates(Workload.build("125M"), machine)
    assert cpu.strategy == "fsdp" and cpu.fits and cpu.gpu_peak_gib == 0 and "accelerator='cpu'" in cpu.notes[0]
