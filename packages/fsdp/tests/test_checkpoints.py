"""Checkpoints: resume equals uninterrupted training (new process), other world sizes, full export,
conversion both ways, and the failures reported against Lightning's FSDP."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import read, run_group

sys.path.insert(0, str(Path(__file__).parent / "scripts"))

from lightning_strategies_fsdp.checkpoint import full_to_sharded, is_sharded_checkpoint, sharded_to_full


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def assert_close(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=1e-5, atol=1e-6, msg=key)


def model_checkpoint_file(reference_run: Path) -> Path:
    # Beside it: core's hidden staging folder, which saves write into before publishing.
    (path,) = (path for path in (reference_run / "every_4").iterdir() if not path.name.startswith("."))
    return path


def test_resume_in_new_process_equals_uninterrupted_training(reference_run: Path) -> None:
    """8 steps straight vs 4 steps + ModelCheckpoint + a new process resuming for 4 more.

    Also Lightning-AI/pytorch-lightning#20373 ("FSDP checkpoint loading fails"): its reproduction
    resumes `trainer.fit(ckpt_path=...)` from a ModelCheckpoint file of a module that calls
    save_hyperparameters(), which this module does.
    """
    checkpoint = model_checkpoint_file(reference_run)
    assert is_sharded_checkpoint(checkpoint)
    out = run_group("resume", reference_run / "resume_mc", "--checkpoint", str(checkpoint), "--tag", "mc")
    result = read(out, "resume_mc")
    assert result["global_step"] == 8
    assert_close(load_weights(out / "resumed_start_mc.pt"), load_weights(reference_run / "weights_4.pt"))
    assert_close(load_weights(out / "resumed_8_mc.pt"), load_weights(reference_run / "uninterrupted_8.pt"))


def test_optimizer_state_survives_save_and_load(reference_run: Path) -> None:
    """Lightning-AI/pytorch-lightning#17702 ("Cannot save and load checkpoints with FSDPStrategy"): the
    optimizer state was lost or failed to load. Here every parameter's AdamW state is in the checkpoint,
    and a resumed run continues from step 4 of the optimizer (the equality test above depends on it)."""
    full = sharded_to_full(model_checkpoint_file(reference_run), reference_run / "mc_as_full.ckpt")
    checkpoint = torch.load(full, weights_only=False)
    (optimizer,) = checkpoint["optimizer_states"]
    assert set(optimizer["state"]) == set(checkpoint["state_dict"])
    for state in optimizer["state"].values():
        assert float(state["step"]) == 4.0
        assert {"exp_avg", "exp_avg_sq"} <= set(state)
        assert torch.count_nonzero(state["exp_avg_sq"]) > 0


def test_sharded_checkpoint_of_two_processes_loads_on_one(reference_run: Path) -> None:
    out = run_group(
        "resume",
        reference_run / "resume_one",
        "--checkpoint",
        str(reference_run / "sharded_4"),
        "--devices",
        "1",
        "--tag",
        "one",
    )
    result = read(out, "resume_one")
    assert result["world_size"] == 1
    assert result["global_step"] == 8
    assert result["optimizer_steps_at_start"] == [4.0]
    assert_close(load_weights(out / "resumed_start_one.pt"), load_weights(reference_run / "weights_4.pt"))


def test_full_checkpoint_resumes_like_a_sharded_one(reference_run: Path) -> None:
    full = reference_run / "full_4.ckpt"
    assert full.is_file()
    out = run_group("resume", reference_run / "resume_full", "--checkpoint", str(full), "--tag", "full")
    assert_close(load_weights(out / "resumed_start_full.pt"), load_weights(reference_run / "full_weights_4.pt"))
    assert_close(load_weights(out / "resumed_8_full.pt"), load_weights(reference_run / "uninterrupted_8.pt"))


def test_full_checkpoint_is_a_plain_lightning_checkpoint(reference_run: Path) -> None:
    """The export loads without FSDP, processes or this package's strategy."""
    from scenarios import TinyTransformer

    model = TinyTransformer.load_from_checkpoint(reference_run / "full_4.ckpt", map_location="cpu")
    assert_close(model.state_dict(), load_weights(reference_run / "full_weights_4.pt"))


def test_conversion_both_ways(reference_run: Path, tmp_path: Path) -> None:
    full = sharded_to_full(reference_run / "sharded_4", tmp_path / "full.ckpt")
    checkpoint = torch.load(full, weights_only=False)
    assert_close(checkpoint["state_dict"], load_weights(reference_run / "weights_4.pt"))
    assert checkpoint["global_step"] == 4
    assert len(checkpoint["optimizer_states"]) == 1

    sharded = full_to_sharded(full, tmp_path / "sharded")
    assert is_sharded_checkpoint(sharded)
    again = torch.load(sharded_to_full(sharded, tmp_path / "again.ckpt"), weights_only=False)
    assert_close(again["state_dict"], checkpoint["state_dict"])
    assert again["global_step"] == 4
    assert_close(
        again["optimizer_states"][0]["state"]["head.weight"], checkpoint["optimizer_states"][0]["state"]["head.weight"]
    )


def test_conversion_command_line(reference_run: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "lightning_strategies_fsdp.convert"]
    done = subprocess.run(
        [*command, str(reference_run / "sharded_4"), str(tmp_path / "out.ckpt")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "wrote full checkpoint file" in done.stdout
    assert torch.load(tmp_path / "out.ckpt", weights_only=False)["global_step"] == 4

    missing = subprocess.run([*command, str(tmp_path / "nothing"), str(tmp_path / "x")], capture_output=True, text=True)
    assert missing.returncode == 2
    assert "No checkpoint at" in missing.stderr


def test_a_checkpoint_without_the_models_state_is_refused_before_loading(tmp_path: Path) -> None:
    from lightning_strategies import CheckpointError
    from lightning_strategies_fsdp.checkpoint import load_full_state

    path = tmp_path / "other.ckpt"
    with pytest.raises(CheckpointError, match=r"The checkpoint file .*other\.ckpt has no model state under 'model'"):
        load_full_state(path, {"state_dict": {}}, torch.nn.Linear(2, 2), "model", {})
