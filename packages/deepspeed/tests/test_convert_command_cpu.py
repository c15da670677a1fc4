"""`lightning-strategies convert` and DeepSpeed, on CPU with two processes: a run saved under ddp (one file) or fsdp
(a DCP folder) goes on under ZeRO 1, 2 and 3 from the universal folder the command writes, on the uninterrupted loss
curve; what does not map exactly is refused; a ZeRO folder becomes one full file or a DCP folder with its Adam
moments (through DeepSpeed's universal layout), or its weights alone with --drop-optimizer-states, and the folder is
DeepSpeed's already.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_weights_close, succeeded, train_together

from lightning_strategies.cli import main as cli

RUN = {"max_epochs": 1, "batches": 4, "optimizer": "adam", "scheduler": True}
FULL = {**RUN, "max_epochs": 2}
STEPS_PER_EPOCH = 4
LOSS_TOLERANCE = 1e-5  # docs/reliability.md: 1e-5 relative for 32-true
SAVED_BY = ("ddp", "fsdp")  # fsdp: a DCP folder, converted through a temporary full file


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("convert")


@pytest.fixture(scope="module")
def saved(folder):
    """One launch: a ZeRO-2 folder; an uninterrupted ZeRO-2 run; the first epoch of the same run under ddp and fsdp."""
    if "fsdp" in SAVED_BY:
        pytest.importorskip("lightning_strategies_fsdp")
    zero = {
        "strategy": "deepspeed_stage_2",
        "max_steps": 2,
        "batches": 2,
        "optimizer": "adam",
        "save": folder / "z.ckpt",
    }
    runs = {"zero": zero, "uninterrupted": {"strategy": "deepspeed_stage_2", **FULL}}
    stage_3 = {**zero, "strategy": "deepspeed_stage_3"}
    # ZeRO-3 splits each process's 338 elements into sub-groups of at most 100, each with its own record of names.
    sub_groups = {"stage": 3, "sub_group_size": 100}
    runs["zero-3-sub-groups"] = {**stage_3, "options": sub_groups, "save": folder / "z3.ckpt"}
    round_robin = {"config": {"zero_optimization": {"stage": 2, "round_robin_gradients": True}}}
    runs["round-robin"] = {**zero, "options": round_robin, "save": folder / "round-robin.ckpt"}
    # A fine-tune: the first layer frozen, whole in rank 0's model states (stages 1 and 2) or partitioned (stage 3:
    # 33 wide, so its bias's 33 elements split over the two processes with one of padding).
    stage_1 = {**zero, "strategy": "deepspeed_stage_1"}
    runs |= {f"frozen-{stage}": {**run, "frozen": True, "save": folder / f"frozen-{stage}.ckpt"}
             for stage, run in ((1, stage_1), (2, zero), (3, {**stage_3, "hidden": 33}))}  # fmt: skip
    runs |= {f"tied-{stage}": {**run, "tied_and_buffers": True, "save": folder / f"tied-{stage}.ckpt"}
             for stage, run in ((1, stage_1), (2, zero), (3, stage_3))}  # fmt: skip
    runs |= {f"first-half-{name}": {"strategy": name, **RUN, "save": folder / f"{name}.ckpt"} for name in SAVED_BY}
    return train_together(folder / "saving", runs)


@pytest.fixture(scope="module")
def zero_folder(folder, saved):
    return folder / "z.ckpt", succeeded(saved, "zero")


@pytest.fixture(scope="module")
def resumed(folder, saved):
    """The second epoch under ZeRO 1, 2 and 3 from the universal folders the command wrote of the ddp and fsdp saves."""
    for name in SAVED_BY:
        succeeded(saved, f"first-half-{name}")
        assert cli(["convert", str(folder / f"{name}.ckpt"), str(folder / f"{name}-zero"), "--to", "deepspeed"]) == 0
    runs = {
        f"{name}->{stage}": {"strategy": stage, **FULL, "resume": folder / f"{name}-zero"}
        for name in SAVED_BY
        for stage in ("deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3")
    }
    return train_together(folder / "resumes", runs)


@pytest.mark.parametrize("source", SAVED_BY)
@pytest.mark.parametrize("stage", ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_another_strategys_run_goes_on_under_zero_with_its_adam_moments(folder, saved, resumed, source, stage):
    """The losses after the resume equal the uninterrupted ZeRO-2 run's: weights, Adam moments and steps, the
    scheduler and the loops came through; with fresh moments they leave the curve from the second step."""
    converted = folder / f"{source}-zero"
    tag_folder = converted / (converted / "latest_universal").read_text()
    names = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")  # stages 1 and 2; 3
    stages_1_2, stage_3 = (tag_folder / name for name in names)
    # One model-states file under both names: a hard link, or a copy where the file system has none.
    assert stages_1_2.samefile(stage_3) or stages_1_2.read_bytes() == stage_3.read_bytes()
    expected = succeeded(saved, "uninterrupted")["losses"][STEPS_PER_EPOCH:]
    losses = succeeded(resumed, f"{source}->{stage}")["losses"]
    assert len(losses) == len(expected) == STEPS_PER_EPOCH
    for got, want in zip(losses, expected, strict=True):
        assert abs(got - want) <= LOSS_TOLERANCE * max(1.0, abs(want)), (losses, expected)


def test_what_does_not_map_exactly_is_refused(tmp_path, capsys):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    sgd.step()
    with_sgd = tmp_path / "sgd.ckpt"
    torch.save({"state_dict": model.state_dict(), "optimizer_states": [sgd.state_dict()], "global_step": 1}, with_sgd)
    assert cli(["convert", str(with_sgd), str(tmp_path / "a"), "--to", "deepspeed"]) == 2
    error = capsys.readouterr().err
    # Positional states with buffers beside the parameters: which state is whose is not recorded.
    assert "keeps its optimizer states by position for 4 of its 7 state_dict entries" in error
    assert "--drop-optimizer-states`) and resume from that file with DeepSpeedStrategy(load_full_weights=True)" in error

    plain = torch.nn.Linear(3, 4)
    plain(torch.randn(5, 3)).sum().backward()
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    sgd.step()
    torch.save({"state_dict": plain.state_dict(), "optimizer_states": [sgd.state_dict()]}, tmp_path / "plain.ckpt")
    assert cli(["convert", str(tmp_path / "plain.ckpt"), str(tmp_path / "b"), "--to", "deepspeed"]) == 2
    assert "has no Adam moments (exp_avg, exp_avg_sq, step) for weight" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["plain.ckpt", "sgd.ckpt"]


def assert_named_adam_states(checkpoint: dict, names: list[str], steps: int) -> None:
    """One optimizer state keyed by parameter name, in the optimizer's order, each with its moments and step."""
    (optimizer,) = checkpoint["optimizer_states"]
    assert [group["params"] for group in optimizer["param_groups"]] == [names]
    for name in names:
        state = optimizer["state"][name]
        assert state["exp_avg"].shape == state["exp_avg_sq"].shape == checkpoint["state_dict"][name].shape
        assert float(state["step"]) == steps and state["exp_avg_sq"].min() >= 0 and state["exp_avg"].abs().sum() > 0


def test_full_keeps_the_adam_moments_or_drops_them_on_request(zero_folder, tmp_path, capsys):
    folder, trained = zero_folder
    out = tmp_path / "full.ckpt"
    assert cli(["convert", str(folder), str(out), "--to", "full"]) == 0
    assert "resume it with every strategy that loads full weights" in capsys.readouterr().out
    written = torch.load(out, weights_only=True)
    assert written["global_step"] == 2
    assert_weights_close(written["state_dict"], trained["weights"])
    assert_named_adam_states(written, list(trained["weights"]), steps=2)
    assert not list(tmp_path.glob(".lightning-strategies-*")), "the scratch universal folder is left"

    weights = tmp_path / "weights.ckpt"
    assert cli(["convert", str(folder), str(weights), "--to", "full", "--drop-optimizer-states"]) == 0
    assert "but not the optimizer states" in capsys.readouterr().out
    written = torch.load(weights, weights_only=True)
    assert "optimizer_states" not in written
    assert_weights_close(written["state_dict"], trained["weights"])


def test_stage_3_sub_groups_map_onto_their_parameters(folder, saved, tmp_path):
    trained = succeeded(saved, "zero-3-sub-groups")
    assert cli(["convert", str(folder / "z3.ckpt"), str(tmp_path / "full.ckpt"), "--to", "full"]) == 0
    written = torch.load(tmp_path / "full.ckpt", weights_only=True)
    assert_weights_close(written["state_dict"], trained["weights"])
    assert_named_adam_states(written, list(trained["weights"]), steps=2)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_frozen_parameters_are_in_the_full_file(folder, saved, tmp_path, stage):
    trained = succeeded(saved, f"frozen-{stage}")
    assert cli(["convert", str(folder / f"frozen-{stage}.ckpt"), str(tmp_path / "full.ckpt"), "--to", "full"]) == 0
    written = torch.load(tmp_path / "full.ckpt", weights_only=True)
    assert_weights_close(written["state_dict"], trained["weights"])  # the frozen layer's included
    assert written["state_dict"]["net.0.bias"].shape == (33 if stage == 3 else 32,)  # stage 3: padding cut off
    assert list(written["optimizer_states"][0]["state"]) == ["net.2.weight", "net.2.bias"]  # states of the rest


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_buffers_and_tied_weights_are_as_deepspeeds_own_merge_writes_them(folder, saved, tmp_path, stage):
    """The one file maps the weights from the universal folder; DeepSpeed's zero_to_fp32 merges them in memory: the
    same state dict, batch norm buffers and both names of a tied weight included."""
    from lightning_strategies_deepspeed.checkpoint import convert_zero_checkpoint

    succeeded(saved, f"tied-{stage}")
    source = folder / f"tied-{stage}.ckpt"
    assert cli(["convert", str(source), str(tmp_path / "full.ckpt"), "--to", "full"]) == 0
    written = torch.load(tmp_path / "full.ckpt", weights_only=True)["state_dict"]
    merged = convert_zero_checkpoint(source)["state_dict"]
    assert {"net.1.running_mean", "net.1.num_batches_tracked", "net.0.weight", "net.2.weight"} <= written.keys()
    assert_weights_close(written, merged, tolerance=0.0)
    assert torch.equal(written["net.0.weight"], written["net.2.weight"])


def test_round_robin_gradients_is_refused_with_the_route_that_works(folder, saved, tmp_path, capsys):
    """DeepSpeed then records the parameters shuffled, and ddp pairs optimizer states with parameters by order."""
    succeeded(saved, "round-robin")
    assert cli(["convert", str(folder / "round-robin.ckpt"), str(tmp_path / "full.ckpt"), "--to", "full"]) == 2
    error = capsys.readouterr().err
    assert "saved with round_robin_gradients" in error and "--drop-optimizer-states" in error
    assert not list(tmp_path.iterdir())  # no output, no scratch folder left


def test_the_folder_is_deepspeeds_already(zero_folder, tmp_path, capsys):
    folder, _ = zero_folder
    assert cli(["convert", str(folder), str(tmp_path / "again"), "--to", "deepspeed"]) == 0
    assert "nothing to convert" in capsys.readouterr().out
    assert not (tmp_path / "again").exists()


def test_a_dcp_folder_with_its_adam_moments(zero_folder, tmp_path, capsys):
    pytest.importorskip("lightning_strategies_fsdp")
    from lightning_strategies_fsdp.checkpoint import sharded_to_full

    folder, trained = zero_folder
    out = tmp_path / "sharded"
    assert cli(["convert", str(folder), str(out), "--to", "fsdp"]) == 0
    back = torch.load(sharded_to_full(out, tmp_path / "back.ckpt"), weights_only=True)
    assert_weights_close(back["state_dict"], trained["weights"])
    assert_named_adam_states(back, list(trained["weights"]), steps=2)
    # The full file it went through was temporary.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["back.ckpt", "sharded"]


@pytest.mark.parametrize("groups_agree", [True, False])
def test_stage_3_refuses_a_universal_folder_without_one_step_for_all(tmp_path, groups_agree):
    """ZeRO stage 3 restores one step count and one set of hyperparameters for all parameters: a folder written from
    param groups that differ holds none, and stage 3 is refused before DeepSpeed fails on it (a KeyError)."""
    from lightning_strategies import CheckpointError
    from lightning_strategies_deepspeed.checkpoint import check_universal_fits_stage, locate

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(
        [{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.1 if groups_agree else 0.01}]
    )
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    checkpoint = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "global_step": 1}
    torch.save(checkpoint, tmp_path / "groups.ckpt")
    assert cli(["convert", str(tmp_path / "groups.ckpt"), str(tmp_path / "zero"), "--to", "deepspeed"]) == 0
    location = locate(tmp_path / "zero")
    for stage, load_optimizer_states in ((1, True), (2, True), (3, False)):
        check_universal_fits_stage(location, stage, load_optimizer_states)
    if groups_agree:
        check_universal_fits_stage(location, 3, True)
        return
    with pytest.raises(CheckpointError, match=r"Resume it under deepspeed_stage_1 or deepspeed_stage_2"):
        check_universal_fits_stage(location, 3, True)
