"""`lightning-strategies convert` from a real ZeRO folder (two processes on CPU): its package reads the weights alone,
so every result without the optimizer states waits for --drop-optimizer-states, and the folder is DeepSpeed's already.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_weights_close, succeeded, train_together

from lightning_strategies.cli import main as cli


@pytest.fixture(scope="module")
def zero_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("convert")
    run = {
        "strategy": "deepspeed_stage_2",
        "max_steps": 2,
        "batches": 2,
        "optimizer": "adam",
        "save": folder / "z.ckpt",
    }
    trained = succeeded(train_together(folder / "saving", {"saved": run}), "saved")
    return folder / "z.ckpt", trained


def test_full_is_refused_until_the_optimizer_states_may_go(zero_folder, tmp_path, capsys):
    folder, trained = zero_folder
    out = tmp_path / "weights.ckpt"
    assert cli(["convert", str(folder), str(out), "--to", "full"]) == 2
    error = capsys.readouterr().err
    assert "a DeepSpeed checkpoint" in error
    assert "drops the optimizer states (for Adam: the moments exp_avg and exp_avg_sq and the step counts" in error
    assert "Add --drop-optimizer-states" in error
    assert not out.exists()

    assert cli(["convert", str(folder), str(out), "--to", "full", "--drop-optimizer-states"]) == 0
    assert "but not the optimizer states" in capsys.readouterr().out
    written = torch.load(out, weights_only=True)
    assert "optimizer_states" not in written
    assert written["global_step"] == 2
    assert_weights_close(written["state_dict"], trained["weights"])


def test_the_folder_is_deepspeeds_already(zero_folder, tmp_path, capsys):
    folder, _ = zero_folder
    assert cli(["convert", str(folder), str(tmp_path / "again"), "--to", "deepspeed"]) == 0
    assert "nothing to convert" in capsys.readouterr().out
    assert not (tmp_path / "again").exists()


def test_a_dcp_folder_of_its_weights_on_request(zero_folder, tmp_path, capsys):
    pytest.importorskip("lightning_strategies_fsdp")
    from lightning_strategies_fsdp.checkpoint import read_weights

    folder, trained = zero_folder
    out = tmp_path / "sharded"
    assert cli(["convert", str(folder), str(out), "--to", "fsdp"]) == 2
    assert "Add --drop-optimizer-states" in capsys.readouterr().err
    assert not out.exists()
    assert cli(["convert", str(folder), str(out), "--to", "fsdp", "--drop-optimizer-states"]) == 0
    assert_weights_close(read_weights(out)["state_dict"], trained["weights"])
    # The full file it went through was temporary.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["sharded"]
