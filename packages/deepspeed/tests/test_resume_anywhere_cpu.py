"""Issue 29, item 1: a ZeRO checkpoint resumes on another number of processes by ckpt_path alone.

Two processes train 2 epochs uninterrupted, and 1 epoch that saves, with ZeRO-2 and ZeRO-3 and Adam with a
step-wise scheduler; one process resumes each saved epoch (converted to DeepSpeed's universal layout on the fly),
and two processes resume a 1-process checkpoint. Every rank sees the same batches (train_script.py turns the
distributed sampler off), so the gradient averaged over 2 processes is the one process's gradient, and the
global batch is the same at every world size: the resumed losses must continue the uninterrupted run's.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import OneProcess, assert_weights_close, succeeded, train_together

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import one_conversion_at_a_time, rank_zero, scratch
from lightning_strategies.checkpoints.scratch import SCRATCH_PREFIX
from lightning_strategies_deepspeed import universal
from lightning_strategies_deepspeed.checkpoint import CheckpointLocation, inspect, load_into_engine, locate
from lightning_strategies_deepspeed.universal import SOURCE, _convert_once, converted_path

STEPS = 4
RUN = {"max_epochs": 1, "batches": 4, "optimizer": "adam", "scheduler": True}
FULL = {**RUN, "max_epochs": 2}
NAMES = ["deepspeed_stage_2", "deepspeed_stage_3"]
BF16 = "bf16-mixed"
# The universal layout keeps the fp32 weights, Adam moments and step counts as saved. Measured on CPU (torch 2.13,
# DeepSpeed 0.19.8, fp32): losses and weights equal the uninterrupted run's exactly (difference 0.0) for 2 -> 1
# and 1 -> 2, stages 2 and 3. The tolerance leaves room for a different reduction order on other hardware.
LOSS_TOLERANCE = 1e-6
WEIGHT_TOLERANCE = 1e-6


def _digests(folder):
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("anywhere")


@pytest.fixture(scope="module")
def two_processes(folder):
    """Uninterrupted 2-process runs, and 2-process first halves that save, by stage."""
    runs = {f"uninterrupted-{name}": {"strategy": name, **FULL} for name in NAMES}
    runs |= {f"first-half-{name}": {"strategy": name, **RUN, "save": folder / f"{name}.ckpt"} for name in NAMES}
    # 16-bit: DeepSpeed trains bf16 weights from fp32 masters, which the universal layout carries.
    runs["uninterrupted-bf16"] = {"strategy": "deepspeed_stage_3", **FULL, "precision": BF16}
    runs["first-half-bf16"] = {"strategy": "deepspeed_stage_3", **RUN, "precision": BF16, "save": folder / "bf16.ckpt"}
    return train_together(folder / "two", runs)


@pytest.fixture(scope="module")
def damaged(folder, two_processes):
    """A copy of the ZeRO-2 checkpoint whose rank-1 optimizer file holds something else (a whole, readable file)."""
    succeeded(two_processes, "first-half-deepspeed_stage_2")
    copy = folder / "damaged.ckpt"
    shutil.copytree(folder / "deepspeed_stage_2.ckpt", copy)
    torch.save({"not": "an optimizer state"}, copy / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    return copy, _digests(copy / "checkpoint"), sorted(path.name for path in copy.iterdir())


@pytest.fixture(scope="module")
def one_process(folder, two_processes, damaged):
    """Each 2-process checkpoint resumed on 1 process (stage 2 twice: the second reuses the conversion); a damaged
    one; and 1-process first halves that save, for the 2-process resumes."""
    for name in NAMES:
        succeeded(two_processes, f"first-half-{name}")
    runs = {f"resumed-{name}": {"strategy": name, **FULL, "devices": 1, "resume": folder / f"{name}.ckpt"}
            for name in NAMES}  # fmt: skip
    runs["again"] = {"strategy": "deepspeed_stage_2", **FULL, "devices": 1, "resume": folder / "deepspeed_stage_2.ckpt"}
    runs["damaged"] = {"strategy": "deepspeed_stage_2", **FULL, "devices": 1, "resume": damaged[0]}
    runs["resumed-bf16"] = {
        "strategy": "deepspeed_stage_3", **FULL, "precision": BF16, "devices": 1, "resume": folder / "bf16.ckpt",
    }  # fmt: skip
    runs |= {f"saved-alone-{name}": {"strategy": name, **RUN, "devices": 1, "save": folder / f"alone-{name}.ckpt"}
             for name in NAMES}  # fmt: skip
    return train_together(folder / "one", runs)


@pytest.fixture(scope="module")
def back_to_two(folder, one_process):
    for name in NAMES:
        succeeded(one_process, f"saved-alone-{name}")
    runs = {name: {"strategy": name, **FULL, "resume": folder / f"alone-{name}.ckpt"} for name in NAMES}
    return train_together(folder / "back", runs)


def _assert_continues(resumed, uninterrupted):
    assert resumed["global_step"] == 2 * STEPS  # loop state
    assert resumed["optimizer_steps"] == STEPS  # only the second epoch ran after the resume
    assert resumed["learning_rate"] == pytest.approx(uninterrupted["learning_rate"], rel=1e-12)  # scheduler
    assert len(uninterrupted["losses"]) == 2 * STEPS
    torch.testing.assert_close(
        torch.tensor(resumed["losses"]),
        torch.tensor(uninterrupted["losses"][STEPS:]),
        atol=LOSS_TOLERANCE,
        rtol=LOSS_TOLERANCE,
    )  # the losses of steps 5 to 8 depend on the weights, the Adam moments and step counts, and the learning rate
    assert_weights_close(resumed["weights"], uninterrupted["weights"], tolerance=WEIGHT_TOLERANCE)


@pytest.mark.parametrize("name", NAMES)
def test_two_process_checkpoint_resumes_on_one(two_processes, one_process, folder, name):
    uninterrupted = succeeded(two_processes, f"uninterrupted-{name}")
    resumed = succeeded(one_process, f"resumed-{name}")
    _assert_continues(resumed, uninterrupted)
    checkpoint = folder / f"{name}.ckpt"
    converted = checkpoint / "checkpoint-universal"
    assert (converted / "latest_universal").is_file() and (converted / SOURCE).is_file()
    assert json.loads((converted / SOURCE).read_text())["world_size"] == 2
    assert (checkpoint / "latest").read_text().strip() == "checkpoint"  # the saved checkpoint is as it was
    assert not any(path.name.startswith(".") for path in checkpoint.iterdir())  # no staging left behind
    assert any(line.startswith(f"Converted {checkpoint}") for line in resumed["info_messages"])


def test_a_bf16_mixed_checkpoint_resumes_on_another_world_size(two_processes, one_process):
    _assert_continues(succeeded(one_process, "resumed-bf16"), succeeded(two_processes, "uninterrupted-bf16"))


def test_a_second_resume_reuses_the_conversion(one_process, two_processes, folder):
    again = succeeded(one_process, "again")
    _assert_continues(again, succeeded(two_processes, "uninterrupted-deepspeed_stage_2"))
    assert any("converted on an earlier resume" in line for line in again["info_messages"])


@pytest.mark.parametrize("name", NAMES)
def test_one_process_checkpoint_resumes_on_two(two_processes, back_to_two, name):
    _assert_continues(succeeded(back_to_two, name), succeeded(two_processes, f"uninterrupted-{name}"))


def test_a_checkpoint_that_cannot_be_converted_is_refused_and_left_as_saved(one_process, damaged):
    copy, digests, names = damaged
    result = one_process["damaged"]
    assert "error" in result, "the damaged checkpoint resumed"
    assert "CheckpointError" in result["error"] and "conversion failed" in result["error"]
    assert "What was saved is unchanged" in result["error"]
    assert _digests(copy / "checkpoint") == digests
    assert not (copy / "checkpoint-universal").exists()
    assert sorted(path.name for path in copy.iterdir()) == names  # staging removed


def test_a_checkpoint_saved_again_is_converted_again_and_a_foreign_folder_is_left(one_process, folder, tmp_path):
    succeeded(one_process, "resumed-deepspeed_stage_2")
    copy = tmp_path / "copy.ckpt"
    shutil.copytree(folder / "deepspeed_stage_2.ckpt", copy)  # modification times kept
    location = locate(copy)
    target = converted_path(location)
    assert "converted on an earlier resume" in _convert_once(location, target, workers=1, weights_only=None)
    optimizer_file = next((copy / "checkpoint").glob("*rank_1_*optim_states.pt"))
    saved_again = optimizer_file.stat().st_mtime_ns + 10**9
    os.utime(optimizer_file, ns=(saved_again, saved_again))  # as a save under the same name would leave it
    assert _convert_once(location, target, workers=1, weights_only=None).startswith(f"Converted {copy}")
    assert json.loads((target / SOURCE).read_text())["files"][optimizer_file.name][1] == saved_again
    assert not (copy / ".lightning-strategies-staging").exists()
    (target / SOURCE).unlink()  # now a folder this conversion did not write: refused, left as it is
    with pytest.raises(CheckpointError, match="not written by this conversion"):
        _convert_once(location, target, workers=1, weights_only=None)
    assert (target / "latest_universal").is_file()


def test_a_second_job_waits_for_the_conversion_under_way_and_reuses_it(one_process, folder, tmp_path, monkeypatch):
    """Two runs resumed from one checkpoint on another world size at once: the second does not convert beside the
    first (each would clear the other's staged files) but waits for it and reads its universal form."""
    succeeded(one_process, "resumed-deepspeed_stage_2")
    saved = folder / "deepspeed_stage_2.ckpt"
    copy = tmp_path / "copy.ckpt"
    shutil.copytree(saved, copy, ignore=shutil.ignore_patterns("*-universal"))  # as saved: not converted yet
    location = locate(copy)
    target = converted_path(location)
    holding, waiting, flock = threading.Event(), threading.Event(), scratch.fcntl.flock

    def watched(descriptor, operation):
        if operation == scratch.fcntl.LOCK_EX:  # the blocking flock: the lock was taken
            waiting.set()
        flock(descriptor, operation)

    monkeypatch.setattr(scratch.fcntl, "flock", watched)

    def first_job():
        with one_conversion_at_a_time(target):
            holding.set()
            assert waiting.wait(60), "the second job never waited for the lock"
            shutil.copytree(converted_path(locate(saved)), target)  # what its conversion publishes

    first = threading.Thread(target=first_job)
    first.start()
    assert holding.wait(30)
    assert "converted on an earlier resume" in _convert_once(location, target, workers=1, weights_only=None)
    first.join(30)
    assert sorted(path.name for path in copy.iterdir()) == sorted(path.name for path in saved.iterdir())


def _cannot_write(path):
    raise PermissionError(errno.EROFS, "Read-only file system", str(path))


def _read_only_copy(folder, tmp_path, monkeypatch):
    """A copy of a two-process checkpoint, not yet converted, in a folder that cannot be written. Stand-in: these
    tests run as root, whom no mode bits stop, so the refusal a read-only mount gives is raised where the conversion
    first writes inside the folder (its lock)."""
    copy = tmp_path / "checkpoints" / "copy.ckpt"
    shutil.copytree(folder / "deepspeed_stage_2.ckpt", copy, ignore=shutil.ignore_patterns("*-universal"))
    monkeypatch.setattr(universal, "one_conversion_at_a_time", _cannot_write)
    return copy


def test_a_folder_that_cannot_be_written_is_converted_beside_it_for_that_resume(
    one_process, folder, tmp_path, monkeypatch
):
    succeeded(one_process, "resumed-deepspeed_stage_2")
    copy = _read_only_copy(folder, tmp_path, monkeypatch)
    saved, layout = inspect(copy)
    with universal.resume_anywhere(OneProcess(), saved, layout, True, None) as (location, _):
        assert location.universal and location.directory.parent.name.startswith(SCRATCH_PREFIX)
        assert location.directory.parent.parent == copy.parent
    assert sorted(path.name for path in copy.parent.iterdir()) == ["copy.ckpt"]  # removed after the load
    assert not converted_path(saved).exists()


def test_a_folder_with_no_place_to_convert_beside_it_names_the_command(one_process, folder, tmp_path, monkeypatch):
    succeeded(one_process, "resumed-deepspeed_stage_2")
    copy = _read_only_copy(folder, tmp_path, monkeypatch)
    monkeypatch.setattr(rank_zero, "new_scratch", _cannot_write)  # the folder around it is read-only too
    saved, layout = inspect(copy)
    refused = pytest.raises(
        CheckpointError, match=r"neither can be written here.*convert --universal .*copy.ckpt OUTPUT`\) and resume"
    )
    with refused, universal.resume_anywhere(OneProcess(), saved, layout, True, None):
        pytest.fail("loaded")


def test_universal_loading_is_set_for_that_load_alone(tmp_path):
    """A later load on the same engine (validate after a resume converted on the fly) reads its own layout."""
    seen = []

    def load_checkpoint(directory, **_):
        seen.append(engine._config.load_universal_checkpoint)
        return None, {"epoch": 1}

    engine = SimpleNamespace(
        _config=SimpleNamespace(load_universal_checkpoint=False),
        load_checkpoint=load_checkpoint,
        zero_optimization_stage=lambda: 2,  # stage 3 would first check the folder's stage-3 state
    )
    engine.checkpoint_engine = None
    location = CheckpointLocation(tmp_path, "checkpoint_universal", universal=True)
    assert load_into_engine(engine, location, None, 1, True, None, True) == {"epoch": 1}
    assert seen == [True] and engine._config.load_universal_checkpoint is False


def test_the_universal_form_written_later_leaves_the_one_file_form_current(one_process, folder, tmp_path):
    """ddp resumes a ZeRO folder through its one-file form; a resume on another number of processes then writes the
    universal form into the same folder, which is derived from the save and does not make the one file stale."""
    from lightning_strategies.checkpoints import one_file_for

    succeeded(one_process, "resumed-deepspeed_stage_2")
    copy = tmp_path / "copy.ckpt"
    shutil.copytree(folder / "deepspeed_stage_2.ckpt", copy)
    universal = converted_path(locate(copy))
    shutil.move(universal, tmp_path / "universal")  # as saved: no universal form yet
    # What one_file_for asks of a strategy, for one process.
    one_process_strategy = SimpleNamespace(
        is_global_zero=True, broadcast=lambda obj: obj, reduce_boolean_decision=lambda decision, all=True: decision
    )
    one_file = Path(one_file_for(copy, one_process_strategy))
    written = one_file.stat().st_mtime_ns
    shutil.copytree(tmp_path / "universal", universal)  # now written
    assert one_file_for(copy, one_process_strategy) == str(one_file)
    assert one_file.stat().st_mtime_ns == written
