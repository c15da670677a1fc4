"""Gemini's memory model for `lightning-strategies plan` (arithmetic; no colossalai or GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_strategies.planning import GIB, Machine, Workload, unfound_evidence
from lightning_strategies_colossalai.memory import (
    CPU_UPDATE_TEMPORARY_BYTES,
    FITTED,
    OFFLOADED_GRADIENT_BYTES,
    Placement,
    candidates,
    choose_static_placement,
    predict_static,
)

ISSUE_MACHINE = Machine(gpus=1, gpu_memory_bytes=139 * GIB, host_memory_bytes=128 * GIB)  # one H200


def test_offload_fractions_move_chunk_bytes_from_gpu_to_host():
    workload = Workload.build("2.7B")
    count = workload.parameters
    on_gpu = predict_static(workload, 1, Placement(0.0, 0.0))
    optimizer_half = predict_static(workload, 1, Placement(0.5, 0.0))
    everything = predict_static(workload, 1, Placement(1.0, 1.0))
    # 14 bytes per parameter: bf16 chunk (2), fp32 master (4), Adam moments (8).
    assert on_gpu.gpu_bytes - everything.gpu_bytes == pytest.approx(14 * count, rel=0.001)
    assert on_gpu.gpu_bytes - optimizer_half.gpu_bytes == pytest.approx(6 * count, rel=0.001)
    # The host holds the offloaded states (6 of 12 bytes), the offloaded chunks' gradients, and bf16's
    # temporaries of HybridAdam's torch update for the largest tensor (the embedding).
    largest = workload.shape.vocabulary * workload.shape.hidden
    extra = 0.5 * OFFLOADED_GRADIENT_BYTES * count + CPU_UPDATE_TEMPORARY_BYTES * largest
    assert optimizer_half.host_bytes - on_gpu.host_bytes == pytest.approx(6 * count + extra, rel=0.001)
    # Unpinned (the strategy's default), nothing offloaded means nothing of the model on the host.
    assert on_gpu.host_bytes < 2.1 * GIB
    assert (on_gpu.offloaded_fraction, everything.offloaded_fraction) == (0.0, 1.0)
    # Chunks are sharded over the GPUs.
    assert on_gpu.gpu_bytes - predict_static(workload, 2, Placement(0.0, 0.0)).gpu_bytes == pytest.approx(
        7 * count, rel=0.001
    )


def test_the_chosen_placement_offloads_the_optimizer_first_and_only_as_much_as_needed():
    assert choose_static_placement(Workload.build("1.3B"), ISSUE_MACHINE) == Placement(0.0, 0.0)
    chosen = choose_static_placement(Workload.build("6.7B", micro_batch=16), ISSUE_MACHINE)
    assert chosen is not None and 0 < chosen.offload_optim_frac <= 1 and chosen.offload_param_frac == 0.0


def test_a_partial_static_placement_is_offered_as_a_strategy_the_trainer_takes():
    workload = Workload.build("6.7B", micro_batch=16)
    chosen = choose_static_placement(workload, ISSUE_MACHINE)
    static = [c for c in candidates(workload, ISSUE_MACHINE) if c.settings.get("placement_policy") == "static"]
    assert [c.strategy for c in static] == ["colossalai"]
    assert static[0].settings["offload_optim_frac"] == chosen.offload_optim_frac
    assert static[0].fits and 0 < static[0].offloaded_fraction < 1
    # Nothing partial to offer where the GPU holds everything.
    small = candidates(Workload.build("1.3B"), ISSUE_MACHINE)
    assert all(c.settings.get("placement_policy") != "static" for c in small)


def test_setup_holds_the_whole_model_on_the_gpu_unless_parameters_are_offloaded():
    """GeminiDDP closes every chunk on the GPU first when no parameter chunk is offloaded."""
    workload = Workload.build("13B", micro_batch=1, activation_checkpointing=True)
    count = workload.parameters
    assert predict_static(workload, 1, Placement(0.9, 0.0)).gpu_bytes >= 6 * count
    assert predict_static(workload, 1, Placement(1.0, 1.0)).gpu_bytes < 6 * count


def test_colossalai_cpu_holds_every_state_and_the_offloaded_gradients_on_the_host():
    workload = Workload.build("6.7B")
    names = {c.strategy: c for c in candidates(workload, ISSUE_MACHINE) if not c.settings}
    # 2 + 4 + 8 bytes of chunk states and 2 of gradient per parameter, above the process's own 2 GiB.
    assert names["colossalai_cpu"].host_peak_gib * GIB > 2 * GIB + 16 * workload.parameters
    assert names["colossalai_cpu"].host_peak_gib < 2 + 16 * workload.parameters / GIB + 4
    assert names["colossalai"].notes == ["placement decided at run time"]  # bf16 too, since auto trains with it
    assert candidates(Workload.build("1B", precision="32-true"), ISSUE_MACHINE) == []


def test_every_fitted_constant_points_at_evidence_that_exists():
    repository = Path(__file__).resolve().parents[3]
    assert unfound_evidence(FITTED, repository) == []


def test_each_node_holds_its_processes_share_of_the_offload_and_gemini_needs_cuda():
    workload = Workload.build("70B")
    one_node = predict_static(workload, 64, Placement(1.0, 1.0))
    eight_nodes = predict_static(workload, 64, Placement(1.0, 1.0), per_node=8)
    assert eight_nodes.host_bytes < one_node.host_bytes / 7
    assert candidates(workload, Machine(gpus=0, gpu_memory_bytes=0, host_memory_bytes=64 * GIB)) == []
