"""Issue 29, item 2: a checkpoint written under one strategy, resumed under another by ``ckpt_path`` alone.

Two processes on CPU, the tiny MLP of train_script.py, torch's Adam with a step-wise scheduler, fp32. Each strategy
trains 2 epochs uninterrupted, and 1 epoch that saves at its end; every checkpoint is then resumed under every
strategy for the second epoch (two launches in all: one for the saves, one for the 25 resumes). Every rank sees
the same batches, so all five strategies follow one loss curve.

Each cell of the (from, to) matrix is one of:
- "exact": the losses after the resume equal the uninterrupted run's within LOSS_TOLERANCE;
- "refused-clear": an error that says what the checkpoint is and the one command or flag that works;
- "refused-unclear": an error or traceback that does not;
- "wrong": the run resumed, but its losses left the uninterrupted curve (weights or optimizer state lost).
MATRIX records what each cell does today; the test keeps it true, so a change in any cell is seen.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from conftest import OneProcess, train_together

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import STAGING_FOLDER, kept_form, source_record
from lightning_strategies.checkpoints.checkpoint_io import ONE_FILE_NAME, ONE_FILE_SOURCE
from lightning_strategies.checkpoints.scratch import SCRATCH_PREFIX
from lightning_strategies.cli import main as cli
from lightning_strategies_deepspeed.checkpoint import convert_zero_checkpoint
from lightning_strategies_deepspeed.foreign import _kept_in, universal_form
from lightning_strategies_deepspeed.from_full import from_full_checkpoint

pytest.importorskip("lightning_strategies_fsdp")

RUN = {"max_epochs": 1, "batches": 4, "optimizer": "adam", "scheduler": True}
FULL = {**RUN, "max_epochs": 2}
STEPS_PER_EPOCH = 4
LOSS_TOLERANCE = 1e-5  # docs/reliability.md: 1e-5 relative for 32-true

# name in the matrix -> (strategy name, constructor options)
STRATEGIES = {
    "ddp": ("ddp", None),
    "fsdp": ("fsdp", None),
    "fsdp-full": ("fsdp", {"state_dict_type": "full"}),
    "deepspeed_stage_1": ("deepspeed_stage_1", None),
    "deepspeed_stage_2": ("deepspeed_stage_2", None),
    "deepspeed_stage_3": ("deepspeed_stage_3", None),
}
# What the refusals of one file under DeepSpeed advise: its weights under DeepSpeedStrategy(load_full_weights=True)
FOLLOWING_ADVICE = {
    f"deepspeed_stage_{stage}-load_full_weights": (
        f"deepspeed_stage_{stage}",
        {"stage": stage, "load_full_weights": True},
    )
    for stage in (2, 3)
}


def _run(name: str, **arguments):
    strategy, options = {**STRATEGIES, **FOLLOWING_ADVICE}[name]
    return {"strategy": strategy, "options": options, **arguments}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("cross")


@pytest.fixture(scope="module")
def saved(folder):
    runs = {f"uninterrupted-{name}": _run(name, **FULL) for name in STRATEGIES}
    runs |= {f"first-half-{name}": _run(name, **RUN, save=folder / f"{name}.ckpt") for name in STRATEGIES}
    runs["end-ddp"] = _run("ddp", **FULL, save=folder / "ddp-end.ckpt")  # other weights, for the repeated loads
    return train_together(folder / "saves", runs)


@pytest.fixture(scope="module")
def resumed(folder, saved):
    runs = {
        f"{source}->{target}": _run(target, **FULL, resume=folder / f"{source}.ckpt")
        for source in STRATEGIES
        for target in STRATEGIES
    }
    # The refusal's way to agree to drop the optimizer states: a copy of the file without them.
    checkpoint = torch.load(folder / "ddp.ckpt")
    del checkpoint["optimizer_states"]
    torch.save(checkpoint, folder / "ddp-weights.ckpt")
    # What the refusals of a ZeRO folder under ddp and fsdp advise: its converted file (weights, no optimizer states).
    convert_zero_checkpoint(folder / "deepspeed_stage_2.ckpt", folder / "deepspeed_stage_2-converted.ckpt")
    runs |= {
        f"deepspeed_stage_2-converted->{target}": _run(
            target, **FULL, resume=folder / "deepspeed_stage_2-converted.ckpt"
        )
        for target in ("ddp", "fsdp")
    }
    runs |= {
        f"{source}->{target}": _run(target, **FULL, resume=folder / f"{source}.ckpt")
        for source in ("ddp", "fsdp-full", "ddp-weights")
        for target in FOLLOWING_ADVICE
    }
    # Files of the weights alone under the plain ZeRO names: a fit from them would start the optimizer afresh.
    runs |= {
        f"{source}->{target}": _run(target, **FULL, resume=folder / f"{source}.ckpt")
        for source in ("ddp-weights", "deepspeed_stage_2-converted")
        for target in ("deepspeed_stage_2", "deepspeed_stage_3")
    }
    # ddp's file (optimizer states by position) made a DCP folder by the convert command, resumed by both.
    assert cli(["convert", str(folder / "ddp.ckpt"), str(folder / "ddp-as-dcp.ckpt"), "--to", "fsdp"]) == 0
    runs |= {
        f"ddp-as-dcp->{target}": _run(target, **FULL, resume=folder / "ddp-as-dcp.ckpt") for target in ("ddp", "fsdp")
    }
    # validate, test, predict, validate on one Trainer and model under ZeRO, each loading another strategy's checkpoint.
    runs |= {
        f"load-each-{target}": _run(target, **RUN, validate=True, load_each=json.dumps([str(folder / f"{source}.ckpt")
                                                                                     for source in LOADED_EACH]))
        for target in ("deepspeed_stage_2", "deepspeed_stage_3")
    }  # fmt: skip
    return train_together(folder / "resumes", runs)


LOADED_EACH = ["ddp", "fsdp", "ddp-end", "fsdp-full"]


DROPPED = (
    r"1 optimizer\(s\) for 4 parameters \(exp_avg, exp_avg_sq, step\).*would drop them.*del c\['optimizer_states'\]"
)
LIGHTNING_NO_OPTIMIZER = r"Trying to restore optimizer state but checkpoint contains only the model"

# (from, to) -> (class, for a refusal: a pattern its message must match). Measured on CPU, 2 processes, fp32, Adam.
# Before issue 29 item 2, fsdp -> ddp and deepspeed_stage_2/3 -> ddp failed with IsADirectoryError (Lightning's ddp
# opening the folder as a file), and the route the refusals of one file under DeepSpeed advised (load_full_weights=True)
# resumed wrong: Adam's state dropped silently.
EXACT = ("exact", None)
ZERO = ("deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3")
MATRIX = {
    **{(source, target): EXACT for source in ("ddp", "fsdp-full") for target in ("ddp", "fsdp", "fsdp-full")},
    **{("fsdp", target): EXACT for target in ("fsdp", "fsdp-full")},
    ("fsdp", "ddp"): EXACT,  # converted once to fsdp.ckpt/full.ckpt (core's one_file_for), then read as one file
    # Read in DeepSpeed's universal layout, written beside the checkpoint for the resume (lightning_strategies_deepspeed
    # .foreign). Before: refused, naming the converter and DeepSpeedStrategy(load_full_weights=True).
    **{(source, target): EXACT for source in ("ddp", "fsdp-full", "fsdp") for target in ZERO},
    # Converted once to <folder>/full.ckpt through DeepSpeed's universal layout (Adam moments by parameter name).
    # Before: refused, naming the converter, whose file kept the weights alone.
    **{(source, target): EXACT for source in ZERO for target in ("ddp", "fsdp", "fsdp-full")},
    # ZeRO 1 and 2 partition the optimizer state alike, and DeepSpeed loads one into the other. ZeRO 3 also partitions
    # the weights: a folder of the other kind is read as another strategy's, through its one-file form and the
    # universal layout (kept inside it). Before: refused, naming the stage it was saved with.
    **{(source, target): EXACT for source in ZERO for target in ZERO},
    # Before: both resumed with the optimizer started afresh, silently (the losses left the curve from the second step).
    **{(source, target): ("refused-clear", DROPPED) for source in ("ddp", "fsdp-full") for target in FOLLOWING_ADVICE},
    # Agreed: the weights, schedulers and loops resume, the optimizer starts afresh.
    **{("ddp-weights", target): ("agreed", None) for target in FOLLOWING_ADVICE},
    # Before: fsdp refused it (DCP's "Missing key ... optimizer_0.state.net.0.weight.step"), ddp resumed it with no
    # Adam state (the positions came back from DCP as strings). Now the folder keys the states by name.
    **{("ddp-as-dcp", target): EXACT for target in ("ddp", "fsdp")},
    # The converted ZeRO folder has no optimizer states: a fit from it is refused.
    ("deepspeed_stage_2-converted", "ddp"): ("refused-clear", LIGHTNING_NO_OPTIMIZER),
    ("deepspeed_stage_2-converted", "fsdp"): ("refused-clear", r"holds the model but no optimizer states"),
    # A fit from the weights alone would start the optimizer afresh: refused, naming the way to agree to that.
    **{(source, target): ("refused-clear", LIGHTNING_NO_OPTIMIZER + r".*load_full_weights=True")
       for source in ("ddp-weights", "deepspeed_stage_2-converted")
       for target in ("deepspeed_stage_2", "deepspeed_stage_3")},
}  # fmt: skip


def classify(result: dict, expected_losses: list[float]) -> str:
    if "error" in result:
        return "refused"
    losses = result["losses"]
    close = len(losses) == len(expected_losses) and all(
        abs(got - want) <= LOSS_TOLERANCE * max(1.0, abs(want))
        for got, want in zip(losses, expected_losses, strict=False)
    )
    return "exact" if close else "wrong"


def test_every_strategy_saves_and_follows_one_loss_curve(saved):
    reference = saved["uninterrupted-ddp"]["losses"]
    assert len(reference) == 2 * STEPS_PER_EPOCH
    for name in STRATEGIES:
        assert "error" not in saved[f"first-half-{name}"], saved[f"first-half-{name}"]
        assert classify(saved[f"uninterrupted-{name}"], reference) == "exact", name


@pytest.mark.parametrize(("source", "target"), list(MATRIX))
def test_cell(saved, resumed, source, target):
    expected, pattern = MATRIX[source, target]
    result = resumed[f"{source}->{target}"]
    got = classify(result, saved["uninterrupted-ddp"]["losses"][STEPS_PER_EPOCH:])
    if expected == "agreed":
        assert got == "wrong", result.get("error") or result["losses"]  # fresh Adam moments: another curve
        assert result["losses"][0] == pytest.approx(saved["uninterrupted-ddp"]["losses"][STEPS_PER_EPOCH], rel=1e-6)
        return
    if expected == "exact":
        assert got == "exact", result.get("error") or result["losses"]
        return
    assert got == "refused", f"{source} -> {target} resumed ({got}): losses {result['losses']}"
    assert re.search(pattern, result["error"], re.DOTALL), result["error"]


@pytest.mark.parametrize("source", ["fsdp", *ZERO])
def test_the_one_file_form_of_a_folder_is_kept_inside_it(folder, resumed, source):
    """fsdp -> ddp (and each ZeRO folder -> ddp) wrote it; the resumes after it (fsdp -> fsdp, ...) read the folder
    with it inside, unchanged."""
    assert (folder / f"{source}.ckpt" / ONE_FILE_NAME).is_file()
    assert (folder / f"{source}.ckpt" / ONE_FILE_SOURCE).is_file()  # what it was converted from, to tell it stale
    assert not (folder / f"{source}.ckpt" / STAGING_FOLDER).exists()
    assert not list(folder.glob(f"{source}.ckpt/{SCRATCH_PREFIX}*")), "the scratch folder is left"


def test_the_universal_forms_written_for_resumes_under_deepspeed_are_removed(folder, resumed):
    """Those of files (ddp's, fsdp's full): written into a scratch folder beside the file for each resume."""
    assert not list(folder.glob(f"{SCRATCH_PREFIX}*")), "a scratch folder is left beside the checkpoints"


def test_the_universal_form_of_a_folder_is_kept_inside_it(folder, resumed):
    """fsdp -> deepspeed_stage_1 wrote it into the DCP folder, beside its one-file form; the resumes under stages 2
    and 3 after it read it as it was (their losses are those of the matrix)."""
    kept = kept_form(folder / "fsdp.ckpt", "deepspeed")
    assert json.loads((kept / "source.json").read_text()) == source_record(folder / "fsdp.ckpt", fabric_keys=None)
    # Written during the first of the three resumes, before its result; not written again by the two after it.
    first_result = folder / "resumes" / "fsdp->deepspeed_stage_1.pt"
    assert (kept / "latest_universal").stat().st_mtime_ns <= first_result.stat().st_mtime_ns


def test_a_kept_universal_form_is_read_without_the_one_file_form(folder, resumed, tmp_path):
    """The one-file form, which the log says may be deleted to reclaim its space, is not written again for a resume
    under deepspeed while the universal form kept beside it is current: that form is read as it is."""
    copy = tmp_path / "fsdp.ckpt"
    shutil.copytree(folder / "fsdp.ckpt", copy)  # times kept: the kept form's record still matches
    (copy / ONE_FILE_NAME).unlink()
    (copy / ONE_FILE_SOURCE).unlink()
    kept = kept_form(copy, "deepspeed")
    written = (kept / "latest_universal").stat().st_mtime_ns
    with universal_form(OneProcess(), copy, None, pytest.fail) as target:
        assert target == kept
    assert (kept / "latest_universal").stat().st_mtime_ns == written
    assert not (copy / ONE_FILE_NAME).exists()


@pytest.mark.parametrize("target", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_evaluation_under_zero_loads_each_other_strategys_checkpoint(saved, resumed, target):
    """Issue 29, item 6: validate, test and predict with ckpt_path= a ddp file, an fsdp folder, a ddp file of the run's
    end and an fsdp file in turn, on one Trainer and model: each call's weights are its checkpoint's. ddp's are the
    reference for the fsdp saves too (one loss curve; the fsdp runs keep theirs as DTensors of their ranks)."""
    loaded = resumed[f"load-each-{target}"]
    assert "error" not in loaded, loaded.get("traceback", loaded.get("error"))
    assert len(loaded["weights_after"]) == len(LOADED_EACH)
    for source, weights in zip(LOADED_EACH, loaded["weights_after"], strict=True):
        expected = saved["end-ddp" if source == "ddp-end" else "first-half-ddp"]["weights"]
        assert weights.keys() == expected.keys()
        for name, tensor in expected.items():
            torch.testing.assert_close(weights[name], tensor, rtol=1e-6, atol=1e-7, msg=f"{source}: {name}")
    first, end = saved["first-half-ddp"]["weights"], saved["end-ddp"]["weights"]
    assert any(not torch.allclose(first[name], end[name]) for name in first)  # the loads differ


def _holds_adam(full):
    assert torch.load(full)["optimizer_states"][0]["state"], "checked before the conversion"


def _adam_checkpoint(path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    torch.save({"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}, path)


def test_a_files_universal_form_is_removed_after_the_load_and_after_a_failed_load(tmp_path):
    """A file's universal form lives in a scratch folder beside it for the load. Where the load fails, it is removed
    once every rank has left the load (here one process, without a process group)."""
    full = tmp_path / "ddp.ckpt"
    _adam_checkpoint(full)
    with universal_form(OneProcess(), full, None, _holds_adam) as target:
        assert (target / "latest_universal").is_file() and target.parent.name.startswith(SCRATCH_PREFIX)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ddp.ckpt"]
    with pytest.raises(RuntimeError, match="the load failed"), universal_form(OneProcess(), full, None, _holds_adam):
        raise RuntimeError("the load failed")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ddp.ckpt"]


def test_a_kept_universal_form_is_reused_until_the_folder_is_saved_again(tmp_path):
    """Another strategy's folder (its own files, and its one-file form inside): the universal form is converted from
    the one-file form once, read as it is while the folder's files are unchanged, and converted again once one of
    them was saved again."""
    folder = tmp_path / "other.ckpt"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"saved once")
    full = folder / ONE_FILE_NAME
    _adam_checkpoint(full)
    conversions = []

    def convert(target):
        conversions.append(target)
        from_full_checkpoint(full, target)

    written, how = _kept_in(folder, None, convert)
    assert written == kept_form(folder, "deepspeed") and how.startswith("written at")
    assert (kept_form(folder, "deepspeed") / "latest_universal").is_file()
    assert _kept_in(folder, None, convert)[1] == f"kept at {written} by an earlier resume" and len(conversions) == 1
    (folder / "__0_0.distcp").write_bytes(b"saved again")
    assert _kept_in(folder, None, convert)[1].startswith("written at") and len(conversions) == 2
    # Read for Fabric under other keys, it is converted again (the keys choose what it holds).
    assert _kept_in(folder, ("net", "adam"), convert)[1].startswith("written at") and len(conversions) == 3
    assert sorted(path.name for path in folder.iterdir()) == ["__0_0.distcp", "converted-deepspeed", ONE_FILE_NAME]


def test_a_folder_conversion_that_fails_leaves_no_universal_form(tmp_path):
    folder = tmp_path / "other.ckpt"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"saved once")
    torch.save({"state_dict": {}}, folder / ONE_FILE_NAME)  # no weights: refused by the conversion
    with pytest.raises(CheckpointError, match="no 'state_dict' entry"):
        _kept_in(folder, None, lambda target: from_full_checkpoint(folder / ONE_FILE_NAME, target))
    assert sorted(path.name for path in folder.iterdir()) == ["__0_0.distcp", ONE_FILE_NAME]
