"""`lightning-strategies convert` from a sharded folder in ColossalAI's own index format: one file with the weights
in the model's order and the optimizer states by parameter name (as the other strategies key them), which the
colossalai strategies load as one file (not taken for shards)."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_checkpoint_files
import torch

from lightning_strategies.cli import main as cli
from lightning_strategies_colossalai.sharded_checkpoint import SHARDED_MARKER, read_weights

# A real Trainer checkpoint's meta.pt beside shards from ColossalAI's own writer.
lightning_checkpoint = test_checkpoint_files.lightning_checkpoint
sharded_folder = test_checkpoint_files.sharded_folder


def test_full_keeps_the_optimizer_states_by_parameter_name(sharded_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "full.ckpt"
    assert cli(["convert", str(sharded_folder), str(out), "--to", "full"]) == 0
    written = torch.load(out, weights_only=True)
    assert SHARDED_MARKER not in written  # else the strategy would skip the weights as loaded from shards
    assert written["global_step"] == 2
    expected = read_weights(sharded_folder)["state_dict"]
    assert list(written["state_dict"]) == list(expected) == ["layer.weight", "layer.bias"]  # the model's order
    for name, tensor in expected.items():
        assert torch.equal(written["state_dict"][name], tensor), name

    by_position = torch.load(sharded_folder.parent / "adam.pt", weights_only=True)  # the saved Adam's state_dict()
    (carried,) = written["optimizer_states"]
    assert carried["param_groups"][0]["params"] == ["layer.weight", "layer.bias"]
    for position, name in enumerate(["layer.weight", "layer.bias"]):
        assert (
            carried["state"][name].keys() == by_position["state"][position].keys() == {"step", "exp_avg", "exp_avg_sq"}
        )
        for key, value in by_position["state"][position].items():
            assert torch.equal(carried["state"][name][key], value), (name, key)


def test_full_without_the_optimizer_states_on_request(sharded_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "weights.ckpt"
    assert cli(["convert", str(sharded_folder), str(out), "--to", "full", "--drop-optimizer-states"]) == 0
    written = torch.load(out, weights_only=True)
    assert "optimizer_states" not in written and written["global_step"] == 2
    assert written["state_dict"].keys() == read_weights(sharded_folder)["state_dict"].keys()


def test_the_folder_is_colossalais_already(sharded_folder: Path, tmp_path: Path, capsys) -> None:
    assert cli(["convert", str(sharded_folder), str(tmp_path / "again"), "--to", "colossalai"]) == 0
    assert "nothing to convert" in capsys.readouterr().out
    assert not (tmp_path / "again").exists()


def test_a_dcp_folder_with_the_optimizer_states(sharded_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning_strategies_fsdp")
    from lightning_strategies_fsdp.checkpoint import read_weights as read_dcp
    from lightning_strategies_fsdp.checkpoint import sharded_to_full

    out = tmp_path / "dcp"
    assert cli(["convert", str(sharded_folder), str(out), "--to", "fsdp"]) == 0
    expected = read_weights(sharded_folder)["state_dict"]
    for name, tensor in read_dcp(out)["state_dict"].items():
        assert torch.equal(tensor, expected[name]), name
    sharded_to_full(out, tmp_path / "back.ckpt")
    (optimizer,) = torch.load(tmp_path / "back.ckpt", weights_only=True)["optimizer_states"]
    assert sorted(optimizer["state"]) == ["layer.bias", "layer.weight"]


def test_deepspeeds_universal_folder_with_the_adam_moments(sharded_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning_strategies_deepspeed")
    out = tmp_path / "zero"
    assert cli(["convert", str(sharded_folder), str(out), "--to", "deepspeed"]) == 0
    saved = torch.load(sharded_folder.parent / "adam.pt", weights_only=True)  # by position: the model's order
    for position, name in enumerate(["layer.weight", "layer.bias"]):
        folder = out / "checkpoint_universal" / "zero" / name
        assert torch.equal(torch.load(folder / "fp32.pt")["param"], read_weights(sharded_folder)["state_dict"][name])
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.load(folder / f"{key}.pt")["param"], saved["state"][position][key]), (name, key)
