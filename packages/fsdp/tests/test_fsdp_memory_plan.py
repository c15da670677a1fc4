"""FSDP2's memory model for `lightning-strategies plan`: sharding divides model states, offloading moves them."""

from __future__ import annotations

import pytest

from lightning_strategies.planning import GIB, Machine, Workload, activation_bytes, plan
from lightning_strategies_fsdp.memory import candidates, predict


def test_sharding_divides_sixteen_bytes_per_parameter_over_the_gpus():
    workload = Workload.build("1B")
    one, _, _ = predict(workload, 1, "fsdp")
    four, _, _ = predict(workload, 4, "fsdp")
    assert one - four == pytest.approx(16 * workload.parameters * 3 / 4, rel=0.001)
    replicas, _, _ = predict(workload, 4, "fsdp_no_shard")
    assert replicas == pytest.approx(one, rel=0.001)


def test_cpu_offload_moves_the_states_to_the_host():
    workload = Workload.build("1B")
    gpu, host, offloaded = predict(workload, 1, "fsdp")
    offloaded_gpu, offloaded_host, fraction = predict(workload, 1, "fsdp_cpu_offload")
    assert (offloaded, fraction) == (0.0, 1.0)
    assert gpu - offloaded_gpu == pytest.approx(16 * workload.parameters, rel=0.001)
    # Offloading keeps all 16 bytes of each parameter's states in host memory.
    assert offloaded_host - host >= 16 * workload.parameters
    assert offloaded_gpu > activation_bytes(workload)  # gathered blocks and activations stay on the GPU


def test_no_process_holds_the_whole_model_on_the_host():
    """configure_model builds on the meta device: a process adds its base memory, not a copy of the model."""
    workload = Workload.build("70B")
    _, one, _ = predict(workload, 1, "fsdp")
    _, eight, _ = predict(workload, 8, "fsdp")
    assert eight - one < 4 * workload.parameters / 8
    assert one < 4 * workload.parameters / 8


def test_shard_grad_op_keeps_every_block_gathered():
    workload = Workload.build("1B")
    assert predict(workload, 4, "fsdp_shard_grad_op")[0] > predict(workload, 4, "fsdp")[0] + GIB


def test_plan_ranks_the_installed_fsdp_names():
    machine = Machine(gpus=1, gpu_memory_bytes=80 * GIB, host_memory_bytes=100 * GIB)
    names = {c.strategy for c in candidates(Workload.build("1B"), machine)}
    assert names == {"fsdp", "fsdp_shard_grad_op", "fsdp_cpu_offload"}  # no_shard is fsdp on one GPU
    result = plan("1B", gpus=1, gpu_memory_gib=80, host_memory_gib=100)
    fsdp = [c for c in result.candidates if c.strategy.startswith("fsdp")]
    assert fsdp and fsdp[0].strategy == "fsdp" and fsdp[0].fits
    assert type(fsdp[0].strategy_object()).__name__ == "FSDP2Strategy"
