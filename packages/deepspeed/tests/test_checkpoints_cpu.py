"""Sharded checkpoints through the Trainer: resuming in a new process continues training exactly.

Lightning-AI/pytorch-lightning#15834 and #17704: resuming stage 2 and stage 3 checkpoints, from
the directory, the tag folder or a file inside it; a different device count via a universal
checkpoint; conversion to one plain state dict.

The runs that save train one after another in one launch of 2 processes (train_script.py --runs);
the runs that resume them train in a second launch, so every resume starts in new processes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_weights_close, succeeded, train_together

from lightning_strategies_deepspeed.checkpoint import convert_to_universal, convert_zero_checkpoint, locate

STEPS = 4  # one epoch of 4 batches. Runs stop on whole epochs: a run stopped by max_steps at an epoch's
# last batch resumes by replaying a batch (Lightning's loop does that for every strategy, DDP included).
RUN = {"max_epochs": 1, "batches": 4, "optimizer": "adam", "scheduler": True}
FULL = {**RUN, "max_epochs": 2}
NAMES = ["deepspeed_stage_2", "deepspeed_stage_3"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def saved(folder):
    """Uninterrupted runs, and runs of their first half that save a checkpoint, by stage."""
    runs = {f"uninterrupted-{name}": {"strategy": name, **FULL} for name in NAMES}
    runs |= {f"first-half-{name}": {"strategy": name, **RUN, "save": folder / f"{name}.ckpt"} for name in NAMES}
    conversion = {"strategy": "deepspeed_stage_3", "max_steps": 2, "batches": 2, "save": folder / "run.ckpt"}
    return train_together(folder / "saving", {**runs, "for-conversion": conversion})


@pytest.fixture(scope="module")
def resumed(folder, saved):
    """Each first half resumed to the end in new processes: stage 2 from the checkpoint folder, stage 3 from a file
    inside its tag folder (#17704)."""
    for name in NAMES:
        succeeded(saved, f"first-half-{name}")
    resume_from = {
        "deepspeed_stage_2": folder / "deepspeed_stage_2.ckpt",
        "deepspeed_stage_3": next((folder / "deepspeed_stage_3.ckpt" / "checkpoint").glob("*model_states.pt")),
    }
    runs = {name: {"strategy": name, **FULL, "resume": resume_from[name]} for name in NAMES}
    # validate, test, predict, validate on one Trainer and model, alternating two checkpoints of different weights.
    stage_3 = [folder / "deepspeed_stage_3.ckpt", folder / "run.ckpt"]
    runs["load-each"] = {"strategy": "deepspeed_stage_3", **RUN, "validate": True, "load_each": json.dumps(
        [str(stage_3[index % 2]) for index in range(4)])}  # fmt: skip
    return train_together(folder / "resuming", runs)


@pytest.mark.parametrize("name", NAMES)
def test_resume_equals_uninterrupted_training(saved, resumed, folder, tmp_path, name):
    uninterrupted = succeeded(saved, f"uninterrupted-{name}")
    first_half = succeeded(saved, f"first-half-{name}")
    checkpoint = folder / f"{name}.ckpt"
    assert checkpoint.is_dir() and (checkpoint / "latest").is_file()
    result = succeeded(resumed, name)
    assert result["global_step"] == 2 * STEPS
    assert result["optimizer_steps"] == STEPS  # only the second half ran in the new process
    assert result["learning_rate"] == pytest.approx(uninterrupted["learning_rate"])  # scheduler restored
    assert result["loaded_mp_world_size"] == 4  # the model's own entry, kept apart from DeepSpeed's
    assert_weights_close(result["weights"], uninterrupted["weights"], tolerance=1e-6)

    # Conversion to one plain state dict: the weights of the first half, loadable without DeepSpeed.
    converted = convert_zero_checkpoint(checkpoint, tmp_path / "plain.ckpt")
    assert converted["global_step"] == STEPS
    assert converted["mp_world_size"] == 4
    plain = torch.load(tmp_path / "plain.ckpt", weights_only=False)["state_dict"]
    assert_weights_close(plain, first_half["weights"])


def test_universal_checkpoint_resumes_on_another_device_count(saved, folder, tmp_path):
    uninterrupted = succeeded(saved, "uninterrupted-deepspeed_stage_2")
    checkpoint = folder / "deepspeed_stage_2.ckpt"
    succeeded(saved, "first-half-deepspeed_stage_2")
    universal = convert_to_universal(checkpoint, tmp_path / "universal")
    assert locate(universal).universal
    one_process = train_together(tmp_path / "one", {"resumed": {"strategy": "deepspeed_stage_2", **FULL,
                                                               "devices": 1, "resume": universal}})  # fmt: skip
    resumed = succeeded(one_process, "resumed")
    assert resumed["global_step"] == 2 * STEPS
    assert_weights_close(resumed["weights"], uninterrupted["weights"], tolerance=1e-5)


def test_convert_command_line(saved, folder, tmp_path):
    checkpoint = folder / "run.ckpt"
    trained = succeeded(saved, "for-conversion")
    output = tmp_path / "plain.ckpt"
    command = [sys.executable, "-m", "lightning_strategies_deepspeed.convert", str(checkpoint), str(output)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "4 tensors" in result.stdout
    assert_weights_close(torch.load(output, weights_only=False)["state_dict"], trained["weights"])
    missing = subprocess.run([*command[:-2], str(tmp_path / "nothing"), str(output)], capture_output=True, text=True)
    assert missing.returncode == 1 and "No checkpoint at" in missing.stderr


def test_validate_test_and_predict_each_load_their_checkpoint_on_one_trainer(saved, resumed):
    """Issue 29, item 6: repeated ckpt_path loads on one Trainer and model, as the fsdp package tests too."""
    expected = [succeeded(saved, "first-half-deepspeed_stage_3"), succeeded(saved, "for-conversion")]
    loaded = succeeded(resumed, "load-each")["weights_after"]
    assert len(loaded) == 4
    for index, weights in enumerate(loaded):
        assert_weights_close(weights, expected[index % 2]["weights"], tolerance=0.0)
