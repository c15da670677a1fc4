"""Nodes as a planner input (issue 31 item 1): --nodes and --gpus-per-node, or torchrun's and SLURM's layout; host
memory per node, with each process's set-up cost as its strategy has it; the stated inter-node assumption; what
would fit, every time nothing does, for 70B on 64 and on 8 GPUs; and training on the CPU (item 2, its CPU part)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable

import pytest

from lightning_strategies.cli import main
from lightning_strategies.planning import GIB, Machine, host_base_bytes, plan
from lightning_strategies.planning.machine import INTER_NODE_ASSUMPTION, launcher_layout
from lightning_strategies.planning.planner import node_layout

LAUNCHER_VARIABLES = (
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "SLURM_NNODES",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_GPUS_ON_NODE",
)
SEVENTY_B = {"gpu_memory_gib": 80, "host_memory_gib": 1024}


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def our_packages(add_plugin: Callable[..., None]) -> None:
    """The three memory models of this project's packages, where installed (each skips the test otherwise)."""
    for module, distribution in (
        ("lightning_strategies_fsdp.plugin", "lightning-strategies-fsdp"),
        ("lightning_strategies_deepspeed.plugin", "lightning-strategies-deepspeed"),
        ("lightning_strategies_colossalai.plugin", "lightning-strategies-colossalai-gemini"),
    ):
        pytest.importorskip(module.rsplit(".", 1)[0])
        add_plugin(importlib.import_module(module), name=module.split(".")[0], distribution=distribution)


def test_gpus_alone_are_one_node_and_nodes_spread_them(no_launcher):
    assert node_layout(64, None, None, {}) == (64, 1, "")
    assert node_layout(64, 8, None, {}) == (64, 8, "")
    assert node_layout(None, 8, 8, {}) == (64, 8, "")
    assert node_layout(64, None, 8, {}) == (64, 8, "")
    assert node_layout(64, 8, 8, {}) == (64, 8, "")
    machine = plan("1B", nodes=8, gpus_per_node=8, **SEVENTY_B).machine
    assert (machine.gpus, machine.nodes, machine.gpus_per_node, machine.processes_per_node) == (64, 8, 8, 8)


def test_contradicting_counts_are_refused_naming_the_flag_to_fix(no_launcher):
    with pytest.raises(ValueError, match=r"--gpus 32 contradicts --nodes 8 --gpus-per-node 8 .*pass --gpus 64"):
        plan("1B", gpus=32, nodes=8, gpus_per_node=8, **SEVENTY_B)
    with pytest.raises(ValueError, match=r"--gpus 60 does not spread evenly over --nodes 8.*--gpus-per-node"):
        plan("1B", gpus=60, nodes=8, **SEVENTY_B)
    with pytest.raises(ValueError, match=r"--nodes 0 \(nodes=0\): must be at least 1"):
        plan("1B", gpus=8, nodes=0, **SEVENTY_B)
    assert main(["plan", "--params", "1B", "--gpus", "32", "--nodes", "8", "--gpus-per-node", "8"]) == 2


def test_torchrun_and_slurm_layouts_are_read_when_no_flag_says(no_launcher):
    assert launcher_layout({"WORLD_SIZE": "64", "LOCAL_WORLD_SIZE": "8"}) == (8, 8, "torchrun")
    assert launcher_layout({"SLURM_NNODES": "4", "SLURM_NTASKS_PER_NODE": "8(x4)"}) == (4, 8, "SLURM")
    assert launcher_layout({"SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "4"}) == (2, 4, "SLURM")
    assert launcher_layout({"WORLD_SIZE": "8"}) is None
    assert launcher_layout({}) is None

    no_launcher.setenv("WORLD_SIZE", "16")
    no_launcher.setenv("LOCAL_WORLD_SIZE", "8")
    machine = plan("1B", **SEVENTY_B).machine
    assert (machine.nodes, machine.gpus_per_node) == (2, 8)
    assert "nodes and gpus_per_node (torchrun)" in machine.detected
    # A flag wins over the environment.
    assert plan("1B", gpus=4, **SEVENTY_B).machine.nodes == 1

    no_launcher.delenv("WORLD_SIZE")
    no_launcher.delenv("LOCAL_WORLD_SIZE")
    no_launcher.setenv("SLURM_NNODES", "4")
    no_launcher.setenv("SLURM_NTASKS_PER_NODE", "8")
    machine = plan("1B", **SEVENTY_B).machine
    assert (machine.gpus, machine.nodes) == (32, 4)
    assert "nodes and gpus_per_node (SLURM)" in machine.detected


def test_host_memory_is_per_node_and_set_up_costs_are_the_strategys(no_launcher):
    """ddp builds the whole model in each process: a node's host holds one copy per process on it, so more nodes
    for the same GPUs lower each node's peak. A strategy building on the meta device (the fsdp package) holds none."""
    one_node = plan("7B", gpus=64, **SEVENTY_B)
    eight_nodes = plan("7B", nodes=8, gpus_per_node=8, **SEVENTY_B)

    def host(result, name):
        return next(c for c in result.candidates if c.strategy == name).host_peak_gib

    per_process_copy = 7e9 * (4 + 8) / GIB  # fp32 weights and Adam's moments, as ddp's teardown brings them back
    assert host(one_node, "ddp") == pytest.approx(host_base_bytes(64) / GIB + 64 * per_process_copy)
    assert host(eight_nodes, "ddp") == pytest.approx(host_base_bytes(8) / GIB + 8 * per_process_copy)
    per_node = Machine(64, 80 * GIB, 1024 * GIB, nodes=8).host_budget_bytes
    assert per_node == Machine(8, 80 * GIB, 1024 * GIB).host_budget_bytes


def test_the_table_states_nodes_per_node_host_memory_and_the_network_assumption(no_launcher, capsys):
    arguments = ["plan", "--params", "1B", "--nodes", "2", "--gpus-per-node", "8", "--gpu-memory", "80"]
    assert main([*arguments, "--host-memory", "512"]) == 0
    out = capsys.readouterr().out
    assert "Machine: 2 node(s) x 8 GPU(s) x 80.0 GiB, host 512.0 GiB per node" in out
    assert f"Network: {INTER_NODE_ASSUMPTION}." in out
    assert main([*arguments, "--host-memory", "512", "--json"]) == 0
    machine = json.loads(capsys.readouterr().out)["machine"]
    assert (machine["nodes"], machine["gpus_per_node"], machine["gpus"]) == (2, 8, 16)
    assert machine["inter_node_assumption"] == INTER_NODE_ASSUMPTION
    assert main(["plan", "--params", "1B", "--gpus", "8", "--gpu-memory", "80", "--host-memory", "512"]) == 0
    assert "Network:" not in capsys.readouterr().out  # one node: no network to assume


def test_70b_on_64_gpus_fits_on_eight_nodes_and_on_one(no_launcher, our_packages):
    """fsdp builds on the meta device: 64 processes cost no 64 copies of the model, on one node or eight."""
    for layout in ({"nodes": 8, "gpus_per_node": 8}, {"gpus": 64}):
        result = plan("70B", activation_checkpointing=True, **layout, **SEVENTY_B)
        assert result.fitting, layout
        fsdp = next(c for c in result.candidates if c.strategy == "fsdp")
        processes = result.machine.processes_per_node
        assert fsdp.fits and fsdp.host_peak_gib == pytest.approx(host_base_bytes(processes) / GIB)


def test_70b_on_8_gpus_says_what_would_fit_and_each_change_does(no_launcher, our_packages):
    result = plan("70B", gpus=8, **SEVENTY_B)
    assert not result.fitting
    kinds = [text.split(" (")[0] for text in result.suggestions]
    assert "activation checkpointing" in kinds
    assert "micro-batch 1" in kinds
    assert "What would: " in result.advice[0]
    # Each named change, made, gives a plan that fits.
    assert plan("70B", gpus=8, activation_checkpointing=True, **SEVENTY_B).fitting
    assert plan("70B", gpus=8, micro_batch=1, **SEVENTY_B).fitting
    # And the fewest nodes like this one on which checkpointing trains without offloading.
    nodes = next(text for text in result.suggestions if text.startswith("activation checkpointing on "))
    count = int(nodes.split()[3])
    assert f"pass --nodes {count} --gpus-per-node 8" in nodes
    more = plan("70B", nodes=count, gpus_per_node=8, activation_checkpointing=True, **SEVENTY_B)
    assert more.fitting[0].offloaded_fraction == 0
    fewer = plan("70B", nodes=count - 1, gpus_per_node=8, activation_checkpointing=True, **SEVENTY_B)
    assert all(c.offloaded_fraction > 0 for c in fewer.fitting)
    # Without activation checkpointing no node count fits a micro-batch of 8 sequences of 1024 tokens: the
    # activations alone pass 80 GiB. With less host memory too, more nodes and the two together are named.
    small_host = plan("70B", gpus=8, gpu_memory_gib=80, host_memory_gib=256, micro_batch=16, seq_len=4096)
    assert not small_host.fitting
    assert small_host.suggestions, small_host.advice


def test_when_no_single_change_fits_the_changes_together_are_named(no_launcher, add_plugin):
    """Activations too large for any GPU count, host too small to offload: checkpointing and micro-batch 1
    together, on the fewest nodes that then fit, is still a concrete answer."""
    from lightning_strategies import hookimpl
    from lightning_strategies.planning import activation_bytes, candidate

    class Sharded:
        @hookimpl
        def register_strategies(registry):
            registry.register("toy_shard", "lightning.pytorch.strategies:DDPStrategy", description="toy")

        @hookimpl
        def memory_plan_candidates(workload, machine):
            gpu = 16 * workload.parameters / max(1, machine.gpus) + activation_bytes(workload)
            return [candidate("toy_shard", {}, gpu, 0, machine)]

    add_plugin(Sharded)
    result = plan("200B", gpus=8, gpu_memory_gib=80, host_memory_gib=256, micro_batch=8, seq_len=8192)
    assert not result.fitting
    assert any(text.startswith("activation checkpointing and micro-batch 1 on ") for text in result.suggestions), (
        result.suggestions
    )
    assert "What would: " in result.advice[0]


def test_no_gpu_plans_training_on_the_cpu_ranked_by_host_memory(no_launcher, capsys):
    result = plan("125M", gpus=0, host_memory_gib=64)
    assert result.best().strategy == "auto" and result.best_strategy() == "auto"
    fitting = result.fitting
    assert all(c.gpu_peak_gib == 0 for c in result.candidates)
    assert [c.host_peak_gib for c in fitting] == sorted(c.host_peak_gib for c in fitting)
    assert {c.strategy for c in fitting} >= {"auto", "ddp"}
    assert "accelerator='cpu'" in fitting[0].notes[0]
    assert main(["plan", "--gpus", "0", "--params", "125M", "--host-memory", "64"]) == 0
    out = capsys.readouterr().out
    assert "Machine: no GPU (the CPU), host 64.0 GiB per node" in out and "Best: auto" in out


def test_cpu_candidates_of_our_packages(no_launcher, our_packages):
    result = plan("125M", gpus=0, host_memory_gib=64)
    names = {c.strategy for c in result.fitting}
    assert {"fsdp", "deepspeed_stage_2", "deepspeed_stage_3"} <= names
    assert not any(c.strategy.startswith("colossalai") for c in result.candidates)  # Gemini needs CUDA


def test_with_only_lightnings_own_strategies_the_advice_names_a_sharding_package(no_launcher, add_plugin):
    """No change makes ddp hold 70B whole on an 80 GiB GPU: the advice says so and names what would spread it."""
    result = plan("70B", gpus=8, **SEVENTY_B)
    assert {c.strategy for c in result.candidates} == {"ddp"}
    assert not result.fitting and not result.suggestions
    assert "pip install lightning-strategies-fsdp" in result.advice[0]
    assert "Nothing tried makes one fit" in result.advice[0]
