"""Progress kept safe (issue #9): a save that fails half way leaves the previous checkpoint whole,
and a checkpoint that cannot be loaded is refused with what it is and what to do, before DeepSpeed
fails somewhere inside.

The checkpoint these tests damage is real: written by 2 processes with ZeRO stage 2 over gloo.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch
from conftest import assert_weights_close, reference_weights, run_training, succeeded, train_together

from lightning_strategies.checkpoints import STAGING_FOLDER, check_file
from lightning_strategies.errors import CheckpointError
from lightning_strategies.testing import written_by_another_package
from lightning_strategies_deepspeed import checkpoint as checkpoints
from lightning_strategies_deepspeed.compatibility import EngineLayout, SavedLayout, check_fits

STEPS_PER_EPOCH = 4
RUN = {"max_epochs": 2, "batches": STEPS_PER_EPOCH}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A ZeRO-2 run on 2 processes whose second epoch-end save failed on every rank, half written."""
    folder = tmp_path_factory.mktemp("interrupted")
    checkpoint = folder / "epoch.ckpt"
    result = run_training(folder / "result.pt", "deepspeed_stage_2", **RUN, save=checkpoint, break_saves_from_epoch=1)
    return result, checkpoint


@pytest.fixture
def saved(interrupted, tmp_path):
    """A copy of the interrupted run's checkpoint (of its first epoch) to damage."""
    copy = tmp_path / "copy.ckpt"
    shutil.copytree(interrupted[1], copy)
    return copy


def test_a_save_failing_half_way_keeps_the_previous_checkpoint(interrupted, tmp_path):
    result, checkpoint = interrupted
    assert result.returncode != 0 and "injected failure after writing" in result.stderr, result.stderr[-3000:]
    # The failed save published nothing, and rank 0 removed what it had staged (files another rank was still
    # writing then may stay in the hidden staging folder, for the next save to clear) ...
    assert [path.name for path in checkpoint.parent.glob("*.ckpt")] == [checkpoint.name]
    staged = checkpoint.parent / STAGING_FOLDER / checkpoint.name / "checkpoint"
    assert not any(staged.glob("*rank_0_*optim_states.pt")) and not any(staged.glob("*rank_00_model_states.pt"))
    # ... and the checkpoint of the first epoch is whole: its weights are those after one epoch,
    converted = checkpoints.convert_zero_checkpoint(checkpoint)
    assert converted["global_step"] == STEPS_PER_EPOCH
    assert_weights_close(converted["state_dict"], reference_weights(STEPS_PER_EPOCH, batches=STEPS_PER_EPOCH))
    # and training resumes from it, with Lightning's default weights_only (the model-states file
    # holding Lightning's state is read with weights_only=True).
    resuming = train_together(tmp_path, {"resumed": {"strategy": "deepspeed_stage_2", **RUN, "resume": checkpoint}})
    resumed = succeeded(resuming, "resumed")
    assert resumed["global_step"] == 2 * STEPS_PER_EPOCH
    assert resumed["optimizer_steps"] == STEPS_PER_EPOCH
    assert_weights_close(resumed["weights"], reference_weights(2 * STEPS_PER_EPOCH, batches=STEPS_PER_EPOCH))


def test_resuming_on_another_number_of_processes_names_both_and_the_fixes(saved, tmp_path):
    """A ZeRO checkpoint resumes on another number of processes through DeepSpeed's universal layout
    (test_resume_anywhere_cpu.py), which carries Adam-type optimizer state only: this one's SGD is refused, before
    any conversion, with the saved number of processes and the route through its weights."""
    saved_files = sorted(path.name for path in saved.iterdir())
    result = run_training(tmp_path / "result.pt", "deepspeed_stage_2", **RUN, devices=1, resume=saved)
    assert result.returncode != 0
    assert "CheckpointError" in result.stderr and "ZeRORuntimeException" not in result.stderr
    message = result.stderr[result.stderr.index("CheckpointError") :]
    assert "on 2 processes" in message and "this run has 1 process," in message
    assert "Adam-type optimizer state only" in message and "What was saved is unchanged" in message
    assert "Resume on 2 processes" in message and "load_full_weights=True" in message
    assert sorted(path.name for path in saved.iterdir()) == saved_files  # nothing converted, nothing staged


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _zero_middle(path):
    """Zeros over the middle of the file, its size kept: a faulty disk or copy, which torch.load reads silently."""
    data = bytearray(path.read_bytes())
    length = min(4000, len(data) // 4)
    start = (len(data) - length) // 2
    data[start : start + length] = bytes(length)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda c: _truncate(c / "checkpoint" / "mp_rank_00_model_states.pt"), "is truncated or corrupted"),
        (lambda c: (c / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b""), "is empty"),
        (lambda c: (c / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink(), r"rank\(s\) 1 of 2"),
        (lambda c: (c / "latest").write_text("global_step9"), "names the tag 'global_step9'"),
        (lambda c: shutil.rmtree(c), "No checkpoint at"),
    ],
    ids=["truncated", "empty", "missing-rank", "latest-elsewhere", "missing"],
)
def test_damaged_checkpoints_are_refused_with_what_to_do(saved, damage, expected):
    damage(saved)
    with pytest.raises(CheckpointError, match=expected) as caught:
        checkpoints.inspect(saved)
    assert str(saved) in str(caught.value)
    assert any(fix in str(caught.value) for fix in ("earlier checkpoint", "copy it again", "Check the path"))


@pytest.mark.parametrize("name", ["zero_pp_rank_1_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"])
def test_a_changed_byte_is_refused_as_damage_by_the_rank_that_reads_the_file(saved, name):
    path = saved / "checkpoint" / name
    _zero_middle(path)  # torch.load reads it without a word
    with pytest.raises(CheckpointError, match=r"is damaged: its record .* does not match") as caught:
        checkpoints.read_saved_file(path, weights_only=None)  # as DeepSpeed reads it, through our engine
    assert "weights_only" not in str(caught.value) and "earlier checkpoint" in str(caught.value)


def test_resuming_with_one_ranks_file_damaged_ends_every_rank_naming_the_file(saved, tmp_path):
    _zero_middle(saved / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    result = run_training(tmp_path / "result.pt", "deepspeed_stage_2", **RUN, resume=saved)
    assert result.returncode != 0, "resumed from a damaged checkpoint"
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt is damaged" in result.stderr, result.stderr[-3000:]


def test_checkpoints_of_other_strategies_are_named_with_how_to_load_them(tmp_path):
    single_file = tmp_path / "ddp.ckpt"
    torch.save({"state_dict": {"weight": torch.ones(2)}}, single_file)
    other_package = tmp_path / "other.ckpt"  # a layout another installed package describes
    (other_package / "model").mkdir(parents=True)
    unknown_folder = tmp_path / "other"
    unknown_folder.mkdir()
    for path, expected in [
        (single_file, "single torch.save checkpoint file.*load_full_weights=True"),
        (other_package, "another package's checkpoint.*load_full_weights=True.*another-package-convert"),
        (unknown_folder, "no checkpoint layout that the installed strategy packages know.*Check the path"),
        (tmp_path / "missing.ckpt", "No checkpoint at"),
    ]:
        with written_by_another_package(other_package), pytest.raises(CheckpointError, match=expected) as caught:
            checkpoints.inspect(path)
        assert isinstance(caught.value, FileNotFoundError)  # what Lightning's DeepSpeed strategy raises there


def test_full_weights_loading_refuses_a_deepspeed_directory_and_damaged_files(saved, tmp_path):
    with pytest.raises(CheckpointError, match="Resume it as one: without load_full_weights"):
        checkpoints.check_full_weights_file(saved)
    damaged = tmp_path / "weights.ckpt"
    torch.save({"state_dict": {"weight": torch.ones(64)}}, damaged)
    _truncate(damaged)
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        checkpoints.check_full_weights_file(damaged)


def test_a_checkpoint_split_another_way_is_refused_before_deepspeed_reads_it(saved):
    _, layout = checkpoints.inspect(saved)
    assert layout == SavedLayout(world_size=2, stage=2, parameter_ranks=(), optimizer_ranks=(0, 1))
    stage_2 = EngineLayout(world_size=2, stage=2, partitioned_parameters=False, partitioned_optimizer=True)
    check_fits(saved, layout, stage_2, restores_optimizer=True)  # the run that saved it
    refusals = [
        (EngineLayout(2, 3, True, True), r"this run uses ZeRO stage 3.*Resume with ZeRO stage 2.*load_full_weights"),
        (EngineLayout(2, 0, False, False), r"keeps the optimizer state whole.*Resume with the ZeRO settings it was"),
    ]
    for engine, expected in refusals:
        with pytest.raises(CheckpointError, match=expected):
            check_fits(saved, layout, engine, restores_optimizer=True)
    # Weights alone (validate, test, predict) load on any number of processes.
    check_fits(saved, layout, EngineLayout(1, 2, False, False), restores_optimizer=False)
    zero_3 = SavedLayout(world_size=2, stage=3, parameter_ranks=(0, 1), optimizer_ranks=(0, 1))
    with pytest.raises(CheckpointError, match=r"saved with ZeRO stage 3 on 2 processes.*this run uses ZeRO stage 2"):
        check_fits(saved, zero_3, stage_2, restores_optimizer=False)


def test_deepspeed_reads_lightning_state_with_weights_only(saved):
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    engine = SimpleNamespace(checkpoint_engine=TorchCheckpointEngine())  # what loading uses of a DeepSpeedEngine
    model_states = saved / "checkpoint" / "mp_rank_00_model_states.pt"
    optimizer_states = saved / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    with checkpoints.checked_reads(engine, weights_only=None):  # torch's default: True
        assert engine.checkpoint_engine.load(str(model_states))["global_step"] == STEPS_PER_EPOCH
        # DeepSpeed's own optimizer-state file pickles DeepSpeed classes: read as DeepSpeed reads it.
        assert "optimizer_state_dict" in engine.checkpoint_engine.load(str(optimizer_states))
    assert type(engine.checkpoint_engine) is TorchCheckpointEngine  # put back

    state = torch.load(model_states, weights_only=False)
    state["hyper_parameters"] = SimpleNamespace(width=32)  # an object that only unpickling can rebuild
    torch.save(state, model_states)
    refused = pytest.raises(CheckpointError, match=r"weights_only=True refuses.*weights_only=False")
    with checkpoints.checked_reads(engine, weights_only=None), refused:
        engine.checkpoint_engine.load(str(model_states))
    with checkpoints.checked_reads(engine, weights_only=False):
        assert engine.checkpoint_engine.load(str(model_states))["hyper_parameters"].width == 32


def test_files_in_torch_legacy_format_are_read(tmp_path):
    """DeepSpeed writes them with the config's checkpoint_serialization=False; they have no zip index."""
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"global_step": 3}, path, _use_new_zipfile_serialization=False)
    check_file(path)  # core knows the format has no table of contents to check
    assert checkpoints.read_saved_file(path, weights_only=True) == {"global_step": 3}


def test_the_conformance_reliability_tier_passes_on_two_processes(tmp_path):
    # Real SIGKILLs inside and between saves, resumes compared with an uninterrupted run, and a
    # rank that raises or is killed in training_step (core's conformance kit).
    from lightning_strategies.conformance import run_check

    report = run_check("deepspeed_stage_2", accelerator="cpu", devices=2, workdir=tmp_path, tiers=("reliability",))
    assert report.passed, str(report)
