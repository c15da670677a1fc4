"""Gemini's memory model for `lightning-strategies plan` (arithmetic; no colossalai or GPU needed)."""

from __future__ import annotations

import pytest

from lightning_strategies.planning import GIB, Machine, Workload
from lightning_strategies_colossalai.memory import Placement, choose_static_placement, plan_candidates, predict_static

ISSUE_MACHINE = Machine(gpus=1, gpu_memory_bytes=139 * GIB, host_memory_bytes=128 * GIB)  # one H200


def test_offload_fractions_move_chunk_bytes_from_gpu_to_host():
    workload = Workload.build("2.7B")
    count = workload.parameters
    on_gpu = predict_static(workload, 1, Placement(0.0, 0.0))
    optimizer_half = predict_static(workload, 1, Placement(0.5, 0.0))
    everything = predict_static(workload, 1, Placement(1.0, 1.0))
    # 14 bytes per parameter: bf16 chunk (2), fp32 master (4), Adam moments (8).
    assert on_gpu[0] - everything[0] == pytest.approx(14 * count, rel=0.001)
    assert on_gpu[0] - optimizer_half[0] == pytest.approx(6 * count, rel=0.001)
    assert optimizer_half[1] - on_gpu[1] == pytest.approx(6 * count, rel=0.001)
    assert (on_gpu[2], everything[2]) == (0.0, 1.0)
    # Chunks are sharded over the GPUs.
    assert on_gpu[0] - predict_static(workload, 2, Placement(0.0, 0.0))[0] == pytest.approx(7 * count, rel=0.001)


def test_the_chosen_placement_offloads_the_optimizer_first_and_only_as_much_as_needed():
    assert choose_static_placement(Workload.build("1.3B"), ISSUE_MACHINE) == Placement(0.0, 0.0)
    chosen = choose_static_placement(Workload.build("6.7B", micro_batch=16), ISSUE_MACHINE)
    assert chosen is not None and 0 < chosen.offload_optim_frac <= 1 and chosen.offload_param_frac == 0.0


def test_a_partial_static_placement_is_offered_as_a_strategy_the_trainer_takes():
    workload = Workload.build("6.7B", micro_batch=16)
    chosen = choose_static_placement(workload, ISSUE_MACHINE)
    static = [c for c in plan_candidates(workload, ISSUE_MACHINE) if c.settings.get("placement_policy") == "static"]
    assert [c.strategy for c in static] == ["colossalai"]
    assert static[0].settings["offload_optim_frac"] == chosen.offload_optim_frac
    assert static[0].fits and 0 < static[0].offloaded_fraction < 1
    # Nothing partial to offer where the GPU holds everything.
    small = plan_candidates(Workload.build("1.3B"), ISSUE_MACHINE)
    assert all(c.settings.get("placement_policy") != "static" for c in small)


def test_colossalai_cpu_of_6_7b_does_not_fit_128_gib_as_measured():
    """The issue's run was killed for host memory in set-up (121 GiB and rising)."""
    names = {c.strategy: c for c in plan_candidates(Workload.build("6.7B"), ISSUE_MACHINE) if not c.settings}
    assert not names["colossalai_cpu"].fits
    assert not names["colossalai"].fits  # placement auto refuses bf16
    assert plan_candidates(Workload.build("1B", precision="32-true"), ISSUE_MACHINE) == []
