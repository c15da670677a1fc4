"""`lightning-strategies convert` from a sharded folder in ColossalAI's own index format: its package reads the
weights alone, so a result without the optimizer states waits for --drop-optimizer-states, and the file written is
one the colossalai strategies load as weights (not taken for shards)."""

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


def test_full_waits_for_the_optimizer_states_to_be_given_up(sharded_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "weights.ckpt"
    assert cli(["convert", str(sharded_folder), str(out), "--to", "full"]) == 2
    error = capsys.readouterr().err
    assert "a ColossalAI sharded checkpoint folder" in error
    assert "drops the optimizer states" in error and "Add --drop-optimizer-states" in error
    assert not out.exists()

    assert cli(["convert", str(sharded_folder), str(out), "--to", "full", "--drop-optimizer-states"]) == 0
    written = torch.load(out, weights_only=False)
    assert SHARDED_MARKER not in written  # else the strategy would skip the weights as loaded from shards
    assert "optimizer_states" not in written
    assert written["global_step"] == 2
    expected = read_weights(sharded_folder)["state_dict"]
    assert written["state_dict"].keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(written["state_dict"][name], tensor), name


def test_the_folder_is_colossalais_already(sharded_folder: Path, tmp_path: Path, capsys) -> None:
    assert cli(["convert", str(sharded_folder), str(tmp_path / "again"), "--to", "colossalai"]) == 0
    assert "nothing to convert" in capsys.readouterr().out
    assert not (tmp_path / "again").exists()


def test_a_dcp_folder_of_its_weights_on_request(sharded_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning_strategies_fsdp")
    from lightning_strategies_fsdp.checkpoint import read_weights as read_dcp

    out = tmp_path / "dcp"
    assert cli(["convert", str(sharded_folder), str(out), "--to", "fsdp", "--drop-optimizer-states"]) == 0
    expected = read_weights(sharded_folder)["state_dict"]
    for name, tensor in read_dcp(out)["state_dict"].items():
        assert torch.equal(tensor, expected[name]), name
