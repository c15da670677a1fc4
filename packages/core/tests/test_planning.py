"""The planner: workload and machine arithmetic, ranking of plugins' candidates, what would fit when nothing
does, `lightning-strategies plan --json`, and a candidate turned into a strategy object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lightning_strategies
from lightning_strategies import hookimpl
from lightning_strategies.cli import main
from lightning_strategies.planning import (
    GIB,
    Fitted,
    Machine,
    ModelShape,
    Workload,
    activation_bytes,
    candidate,
    parse_count,
    plan,
    smallest_fitting_fraction,
    unfound_evidence,
)
from lightning_strategies.planning.candidates import rank
from lightning_strategies.planning.fitted import FITTED
from lightning_strategies.planning.machine import available_memory, host_memory


class ToyPlugin:
    """A strategy with a one-line memory model: 16 bytes per parameter on the GPU, or all on the host when
    offloaded, plus the activations core computes."""

    @hookimpl
    def register_strategies(registry):
        registry.register("toy_ddp", "lightning.pytorch.strategies:DDPStrategy", description="toy")
        registry.register("toy_offload", "lightning.pytorch.strategies:DDPStrategy", description="toy offload")

    @hookimpl
    def memory_plan_candidates(workload, machine):
        states = 16 * workload.parameters
        activations = activation_bytes(workload)
        gpus = max(1, machine.gpus)
        return [
            candidate("toy_ddp", {"find_unused_parameters": True}, states / gpus + activations, 0, machine),
            candidate("toy_offload", {}, activations, states, machine, offloaded_fraction=1.0),
            candidate("not_registered", {}, 0, 0, machine),  # names the registry lacks are dropped
        ]


class BrokenPlugin:
    @hookimpl
    def register_strategies(registry):
        registry.register("broken_model", "lightning.pytorch.strategies:DDPStrategy")

    @hookimpl
    def memory_plan_candidates():
        raise RuntimeError("model failed")


def test_parameter_counts_read_as_people_write_them():
    assert parse_count("13B") == 13_000_000_000
    assert parse_count("6.7b") == 6_700_000_000
    assert parse_count("350M") == 350_000_000
    assert parse_count("1.3e9") == 1_300_000_000
    with pytest.raises(ValueError, match=r"write e\.g\. 13B"):
        parse_count("lots")


def test_a_parameter_count_gets_a_gpt3_shape_of_about_that_size():
    shape = ModelShape.for_parameters(6_700_000_000)
    assert (shape.layers, shape.hidden) == (32, 4096)
    assert shape.parameters(2048) == pytest.approx(6.7e9, rel=0.03)
    assert ModelShape.for_parameters(2_700_000_000).hidden == 2560


def test_a_shapes_tensors_add_up_to_its_parameters_in_module_order():
    shape = ModelShape(layers=3, hidden=64, vocabulary=1000)
    sizes = shape.tensor_sizes(128)
    assert sum(sizes) == shape.parameters(128)
    assert len(sizes) == 2 + 12 * 3 + 3  # embeddings, twelve tensors a block, the final norm and the head
    assert sizes[:3] == [1000 * 64, 128 * 64, 64] and sizes[-1] == 1000 * 64


def test_mixed_precision_adam_keeps_sixteen_bytes_per_parameter():
    workload = Workload.build("1B", precision="bf16-mixed")
    states = workload.state_bytes()
    assert (states.weights, states.gradients, states.master, states.optimizer) == (2, 2, 4, 8)
    assert states.total == 16 and states.optimizer_side == 12
    assert Workload.build("1B", precision="32-true").state_bytes().total == 16  # 4 + 4 + no master + 8
    assert Workload.build("1B", optimizer="sgd").state_bytes().total == 12


def test_activation_checkpointing_lowers_activations_and_they_grow_with_the_micro_batch():
    plain = Workload.build("1.3B", micro_batch=8)
    checkpointed = Workload.build("1.3B", micro_batch=8, activation_checkpointing=True)
    assert activation_bytes(checkpointed) < activation_bytes(plain) / 3
    half = Workload.build("1.3B", micro_batch=4)
    assert activation_bytes(half) == pytest.approx(activation_bytes(plain) / 2)


def test_host_memory_is_the_cgroup_limit_where_lower(tmp_path: Path):
    (tmp_path / "meminfo").write_text("MemTotal:       134217728 kB\nMemFree: 1 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert host_memory(tmp_path / "meminfo", cgroup) == 128 * GIB
    (cgroup / "memory.max").write_text(f"{24 * GIB}\n")
    assert host_memory(tmp_path / "meminfo", cgroup) == 24 * GIB
    (cgroup / "memory.max").write_text("max\n")
    assert host_memory(tmp_path / "meminfo", cgroup) == 128 * GIB


def test_available_memory_is_what_is_left_under_the_cgroup_limit_where_less(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       134217728 kB\nMemAvailable:   67108864 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert available_memory(meminfo, cgroup) == 64 * GIB
    (cgroup / "memory.max").write_text(f"{24 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{20 * GIB}\n")
    assert available_memory(meminfo, cgroup) == 4 * GIB  # the container's limit, not the machine's memory
    (cgroup / "memory.stat").write_text(f"anon 1\ninactive_file {3 * GIB}\nactive_file 5\n")
    assert available_memory(meminfo, cgroup) == 7 * GIB  # page cache not in use is reclaimed before a kill
    (cgroup / "memory.stat").unlink()
    (cgroup / "memory.current").write_text(f"{24 * GIB}\n")
    assert available_memory(meminfo, cgroup) == 0  # at the limit: nothing left, not unknown
    (cgroup / "memory.max").write_text("max\n")
    assert available_memory(meminfo, cgroup) == 64 * GIB
    assert available_memory(tmp_path / "absent", tmp_path / "absent") is None  # not known


def test_fits_leaves_room_for_the_cuda_context_and_host_headroom():
    machine = Machine(gpus=1, gpu_memory_bytes=80 * GIB, host_memory_bytes=100 * GIB)
    assert candidate("x", {}, machine.gpu_budget_bytes, 0, machine).fits
    assert not candidate("x", {}, machine.gpu_budget_bytes + 1, 0, machine).fits
    assert machine.gpu_budget_bytes < 80 * GIB
    assert not candidate("x", {}, 0, 99 * GIB, machine).fits
    assert not candidate("x", {}, 0, 0, machine, nvme_bytes=1).fits  # no NVMe unless given
    assert not candidate("x", {}, 1, 0, Machine(0, 0, 100 * GIB)).fits  # no GPU for a GPU peak
    assert candidate("x", {}, 0, 0, Machine(0, 0, 100 * GIB)).fits  # training on the CPU holds none


def test_a_plan_that_leaves_little_of_the_gpu_free_advises_expandable_segments(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    machine = Machine(gpus=1, gpu_memory_bytes=79 * GIB, host_memory_bytes=128 * GIB)
    (note,) = candidate("x", {}, 67.6 * GIB, 0, machine).notes  # the H100 plan that ran out of memory without
    assert "leaves 11 GiB of each GPU free" in note and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in note
    assert candidate("x", {}, 60 * GIB, 0, machine).notes == []  # 19 GiB free
    assert candidate("x", {}, 67.6 * GIB, 200 * GIB, machine).notes == []  # does not fit: nothing to advise
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512,expandable_segments:True")
    assert candidate("x", {}, 67.6 * GIB, 0, machine).notes == []  # already set


def test_smallest_fitting_fraction_is_the_least_offload_that_fits():
    machine = Machine(gpus=1, gpu_memory_bytes=100 * GIB, host_memory_bytes=1000 * GIB)
    budget = machine.gpu_budget_bytes

    def peaks(fraction):  # 2 x budget of states; offloading a fraction moves it to the host
        return 2 * budget * (1 - fraction), 2 * budget * fraction

    assert smallest_fitting_fraction(peaks, machine) == 0.5
    assert smallest_fitting_fraction(lambda fraction: (2 * budget, 0), machine) is None


def test_ranking_puts_fitting_first_then_least_offload():
    machine = Machine(gpus=1, gpu_memory_bytes=80 * GIB, host_memory_bytes=100 * GIB)
    ranked = rank(
        [
            candidate("too_big", {}, 200 * GIB, 0, machine),
            candidate("offloads", {}, 10 * GIB, 10 * GIB, machine, offloaded_fraction=1.0),
            candidate("partial", {}, 40 * GIB, 5 * GIB, machine, offloaded_fraction=0.3),
            candidate("on_gpu_slow", {}, 30 * GIB, 0, machine, preference=1),
            candidate("on_gpu", {}, 50 * GIB, 0, machine),
        ]
    )
    assert [c.strategy for c in ranked] == ["on_gpu", "on_gpu_slow", "partial", "offloads", "too_big"]


def test_plan_asks_every_plugin_and_ranks_their_candidates(add_plugin):
    add_plugin(ToyPlugin)
    add_plugin(BrokenPlugin, name="broken", distribution="broken-dist")
    result = plan("1B", gpus=1, gpu_memory_gib=80, host_memory_gib=100)
    # Lightning's plain single-device strategy comes from core, before the plugins' own.
    assert [c.strategy for c in result.candidates] == ["auto", "toy_ddp", "toy_offload"]
    assert all(c.fits for c in result.candidates)
    toys = result.candidates[1:]
    assert toys[0].gpu_peak_gib > toys[1].gpu_peak_gib
    assert result.problems and "memory_plan_candidates failed" in result.problems[0]
    assert result.suggestions == []
    # More GPUs divide the toy's states.
    two = plan("1B", gpus=2, gpu_memory_gib=80, host_memory_gib=100)
    assert next(c for c in two.candidates if c.strategy == "toy_ddp").gpu_peak_gib < toys[0].gpu_peak_gib


def test_when_nothing_fits_the_plan_says_what_would(add_plugin):
    add_plugin(ToyPlugin)
    # 20B x 16 bytes = 298 GiB: neither one 80 GiB GPU nor 100 GiB of host holds it.
    result = plan("20B", micro_batch=1, gpus=1, gpu_memory_gib=80, host_memory_gib=100)
    assert not result.fitting
    # The fewest GPUs that fit, on this node.
    assert any(text.startswith("5 GPUs of this kind on this node (toy_ddp") for text in result.suggestions), (
        result.suggestions
    )
    with pytest.raises(ValueError, match=r"No installed strategy fits 20\.00B parameters.*What would: .*5 GPUs"):
        result.best()


def test_smaller_micro_batch_and_checkpointing_are_suggested_when_activations_are_the_problem(add_plugin):
    add_plugin(ToyPlugin)
    # 125M parameters fit easily; the blocks' activations of 64 sequences of 2048 tokens do not. (A small
    # vocabulary: with GPT-2's, the logits alone would not fit, and checkpointing does not shrink them.)
    result = plan("125M", vocabulary=1024, micro_batch=64, seq_len=2048, gpus=1, gpu_memory_gib=24, host_memory_gib=100)
    assert not result.fitting
    kinds = [text.split(" (")[0] for text in result.suggestions]
    assert "activation checkpointing" in kinds
    assert any(kind.startswith("micro-batch ") for kind in kinds)


def test_no_gpu_here_says_how_to_plan_for_another_machine(add_plugin):
    add_plugin(ToyPlugin)
    # 20B x 16 bytes: too much for 100 GiB of host memory, so training on the CPU does not fit either.
    result = plan("20B", gpus=0, gpu_memory_gib=0, host_memory_gib=100)
    with pytest.raises(ValueError, match=r"on the CPU with 100 GiB.*pass --gpus N and --gpu-memory GiB"):
        result.best()


def test_a_candidate_becomes_a_strategy_object_for_the_trainer(add_plugin):
    from lightning.pytorch.strategies import DDPStrategy

    add_plugin(ToyPlugin)
    result = plan("1B", gpus=1, gpu_memory_gib=80, host_memory_gib=100)
    assert result.best_strategy() == "auto"  # Lightning's plain answer on one device
    strategy = next(c for c in result.candidates if c.strategy == "toy_ddp").strategy_object()
    assert isinstance(strategy, DDPStrategy)
    assert strategy._ddp_kwargs == {"find_unused_parameters": True}  # the candidate's settings reached it
    assert lightning_strategies.plan is plan


def test_plan_json_lists_candidates_with_the_documented_fields(add_plugin, capsys):
    add_plugin(ToyPlugin)
    arguments = ["plan", "--params", "1B", "--gpus", "1", "--gpu-memory", "80", "--host-memory", "100", "--json"]
    assert main(arguments) == 0
    answer = json.loads(capsys.readouterr().out)
    listed = answer["candidates"]
    assert [entry["strategy"] for entry in listed] == ["auto", "toy_ddp", "toy_offload"]
    assert answer["best"] == listed[0] and answer["advice"] == [] and answer["problems"] == []
    assert answer["machine"]["gpus"] == 1 and answer["workload"]["parameters"] == 10**9
    for entry in listed:
        assert {"strategy", "settings", "gpu_peak_gib", "host_peak_gib", "fits", "offloaded_fraction"} <= set(entry)
        assert isinstance(entry["gpu_peak_gib"], float) and isinstance(entry["fits"], bool)
    assert listed[1]["settings"] == {"find_unused_parameters": True}


def test_plan_table_and_exit_status_when_nothing_fits(add_plugin, capsys):
    add_plugin(ToyPlugin)
    arguments = ["--params", "20B", "--micro-batch", "1", "--gpus", "1", "--gpu-memory", "80", "--host-memory", "100"]
    assert main(["plan", *arguments]) == 1
    output = capsys.readouterr().out
    assert "FITS  STRATEGY" in output and "toy_offload" in output
    assert "how far they were from GPU measurements" in output
    assert "What would:" in output


def test_plan_needs_a_size():
    with pytest.raises(ValueError, match="params='13B'"):
        Workload.build(None)
    assert main(["plan", "--gpus", "1", "--gpu-memory", "80", "--host-memory", "100"]) == 2


def test_every_fitted_constant_of_core_points_at_evidence_that_exists(tmp_path):
    repository = Path(__file__).resolve().parents[3]
    assert unfound_evidence(FITTED, repository) == []
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Predicted against measured\n")
    table = {"X": Fitted(1, "x", ("page.md#predicted-against-measured", "page.md#elsewhere", "absent.json"))}
    assert unfound_evidence(table, tmp_path) == ["X: page.md#elsewhere", "X: absent.json"]


@pytest.mark.parametrize(
    ("arguments", "flag"),
    [
        (["--params", "0"], "--params 0"),
        (["--params=-2B"], "--params -2B"),
        (["--params", "lots"], "--params lots"),
        (["--params", "1B", "--layers", "0", "--hidden", "512"], "--layers 0"),
        (["--params", "1B", "--seq-len", "-1"], "--seq-len -1"),
        (["--params", "1B", "--micro-batch", "0"], "--micro-batch 0"),
        (["--params", "1B", "--vocabulary", "0"], "--vocabulary 0"),
        (["--params", "1B", "--gpus", "-1"], "--gpus -1"),
        (["--params", "1B", "--gpu-memory", "0"], "--gpu-memory 0"),
        (["--params", "1B", "--gpu-memory", "-80"], "--gpu-memory -80"),
        (["--params", "1B", "--gpu-memory", "nan"], "--gpu-memory nan"),
        (["--params", "1B", "--host-memory", "0"], "--host-memory 0"),
        (["--params", "1B", "--nvme", "-1"], "--nvme -1"),
    ],
)
def test_plan_refuses_sizes_counts_and_memory_that_are_zero_negative_or_unreadable(arguments, flag, capsys):
    machine = {"--gpus": "1", "--gpu-memory": "80", "--host-memory": "100"}
    for option, value in machine.items():
        if not any(argument.split("=")[0] == option for argument in arguments):
            arguments = [*arguments, option, value]
    assert main(["plan", *arguments]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {flag}") and "pass e.g." in error


def test_gpus_without_their_size_on_a_machine_without_gpus_asks_for_the_size(monkeypatch, capsys):
    from lightning_strategies.planning import machine

    monkeypatch.setattr(machine, "_cuda_devices", lambda: (0, 0))
    assert main(["plan", "--params", "1B", "--gpus", "8", "--host-memory", "100"]) == 2
    assert "pass --gpu-memory GiB" in capsys.readouterr().err
    with pytest.raises(ValueError, match="gpu_memory_gib="):
        plan("1B", gpus=8, host_memory_gib=100)
    assert main(["plan", "--params", "1B", "--gpus", "8", "--gpu-memory", "80", "--host-memory", "100"]) in (0, 1)


def test_plan_json_carries_the_advice_and_problems_the_table_prints(add_plugin, capsys):
    add_plugin(ToyPlugin)
    add_plugin(BrokenPlugin, name="broken", distribution="broken-dist")
    arguments = ["--params", "20B", "--micro-batch", "1", "--gpus", "1", "--gpu-memory", "80", "--host-memory", "100"]
    assert main(["plan", *arguments, "--json"]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer["best"] is None
    assert len(answer["advice"]) == 1 and "What would:" in answer["advice"][0]
    assert answer["suggestions"] and all(text in answer["advice"][0] for text in answer["suggestions"])
    assert any("model failed" in problem for problem in answer["problems"])
    no_gpu = ["--params", "20B", "--gpus", "0", "--gpu-memory", "0", "--host-memory", "100", "--json"]
    assert main(["plan", *no_gpu]) == 1
    assert "No CUDA device was found" in json.loads(capsys.readouterr().out)["advice"][0]


def test_a_small_model_gets_the_plain_answer_single_device_or_ddp():
    """Lightning's own strategies are candidates wherever the model fits whole on each GPU (with no plugin
    installed too), ranked before sharding, which only costs collectives there."""
    one = plan("125M", gpus=1, gpu_memory_gib=80, host_memory_gib=64)
    assert one.best().strategy == "auto" and one.best_strategy() == "auto"
    assert one.best().notes == [
        "Lightning's own strategy: the model and its optimizer whole on one device (Lightning's SingleDeviceStrategy)"
    ]
    eight = plan("125M", gpus=8, gpu_memory_gib=80, host_memory_gib=512)
    assert eight.best().strategy == "ddp"
    from lightning.pytorch.strategies import DDPStrategy

    assert isinstance(eight.best_strategy(), DDPStrategy)
    # Too large to hold whole on one GPU: the plain strategies are listed as not fitting (a sharded one wins where a
    # sharding package is installed).
    large = plan("13B", gpus=8, gpu_memory_gib=80, host_memory_gib=1024)
    plain = next(c for c in large.candidates if c.strategy == "ddp")
    assert not plain.fits and all(candidate.strategy != "ddp" for candidate in large.fitting)


def test_plain_strategies_hold_the_whole_model_per_gpu_and_build_it_on_the_host_in_each_process():
    from lightning_strategies.planning.builtins import predict

    workload = Workload.build("1B", precision="bf16-mixed")
    count, activations = workload.parameters, activation_bytes(workload)
    # fp32 weights and gradients, Adam's moments, autocast's bf16 copy; DDP adds its gradient buckets.
    assert predict(workload, 1, "auto").gpu_bytes == count * (4 + 4 + 8 + 2) + activations
    assert predict(workload, 4, "ddp").gpu_bytes == count * (4 + 4 + 8 + 2 + 4) + activations
    # Each process builds the fp32 model, and teardown brings it and the moments back to the host.
    assert predict(workload, 4, "ddp").host_bytes - predict(workload, 1, "auto").host_bytes == pytest.approx(
        3 * count * 12 + 3 * 2 * GIB
    )
    true32 = Workload.build("1B", precision="32-true")
    assert predict(true32, 1, "auto").gpu_bytes == true32.parameters * 16 + activation_bytes(true32)
