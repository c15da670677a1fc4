"""Sharded checkpoints through the Trainer: resuming in a new process continues training exactly.

Lightning-AI/pytorch-lightning#15834 and #17704: resuming stage 2 and stage 3 checkpoints, from
the directory, the tag folder or a file inside it; a different device count via a universal
checkpoint; conversion to one plain state dict.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import assert_weights_close

from lightning_strategies_deepspeed.checkpoint import convert_to_universal, convert_zero_checkpoint, locate

STEPS = 4  # one epoch of 4 batches. Runs stop on whole epochs: a run stopped by max_steps at an epoch's
# last batch resumes by replaying a batch (Lightning's loop does that for every strategy, DDP included).
RUN = {"max_epochs": 1, "batches": 4, "optimizer": "adam", "scheduler": True}
FULL = {**RUN, "max_epochs": 2}


@pytest.mark.parametrize("name", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_resume_equals_uninterrupted_training(train, tmp_path, name):
    uninterrupted = train(name, **FULL)
    checkpoint = tmp_path / "half.ckpt"
    first_half = train(name, **RUN, save=checkpoint)
    assert checkpoint.is_dir() and (checkpoint / "latest").is_file()
    # A file inside the tag folder is accepted too (#17704).
    inner_file = next((checkpoint / "checkpoint").glob("*model_states.pt"))
    resumed = train(name, **FULL, resume=inner_file if name.endswith("3") else checkpoint)
    assert resumed["global_step"] == 2 * STEPS
    assert resumed["optimizer_steps"] == STEPS  # only the second half ran in the new process
    assert resumed["learning_rate"] == pytest.approx(uninterrupted["learning_rate"])  # scheduler restored
    assert resumed["loaded_mp_world_size"] == 4  # the model's own entry, kept apart from DeepSpeed's
    assert_weights_close(resumed["weights"], uninterrupted["weights"], tolerance=1e-6)

    # Conversion to one plain state dict: the weights of the first half, loadable without DeepSpeed.
    converted = convert_zero_checkpoint(checkpoint, tmp_path / "plain.ckpt")
    assert converted["global_step"] == STEPS
    assert converted["mp_world_size"] == 4
    plain = torch.load(tmp_path / "plain.ckpt", weights_only=False)["state_dict"]
    assert_weights_close(plain, first_half["weights"])


def test_universal_checkpoint_resumes_on_another_device_count(train, tmp_path):
    uninterrupted = train("deepspeed_stage_2", **FULL)
    checkpoint = tmp_path / "two-devices.ckpt"
    train("deepspeed_stage_2", **RUN, save=checkpoint)
    universal = convert_to_universal(checkpoint, tmp_path / "universal")
    assert locate(universal).universal
    resumed = train("deepspeed_stage_2", **FULL, devices=1, resume=universal)
    assert resumed["global_step"] == 2 * STEPS
    assert_weights_close(resumed["weights"], uninterrupted["weights"], tolerance=1e-5)


def test_convert_command_line(tmp_path, train):
    checkpoint = tmp_path / "run.ckpt"
    trained = train("deepspeed_stage_3", max_steps=2, batches=2, save=checkpoint)
    output = tmp_path / "plain.ckpt"
    command = [sys.executable, "-m", "lightning_strategies_deepspeed.convert", str(checkpoint), str(output)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "4 tensors" in result.stdout
    assert_weights_close(torch.load(output, weights_only=False)["state_dict"], trained["weights"])
    missing = subprocess.run([*command[:-2], str(tmp_path / "nothing"), str(output)], capture_output=True, text=True)
    assert missing.returncode == 1 and "No checkpoint at" in missing.stderr
