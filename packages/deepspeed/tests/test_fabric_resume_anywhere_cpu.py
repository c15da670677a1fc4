"""Issue 29 with Fabric: fabric.load of a ZeRO-1, -2 or -3 checkpoint saved on 2 processes, on 1 process, continues
the uninterrupted 2-process run (item 1); so do a ZeRO-2 checkpoint under ZeRO-3 and a ZeRO-3 one under ZeRO-1, a
checkpoint ddp saved, under deepspeed_stage_3, and one ZeRO-3 saved, under fsdp, and back (item 2)
(fabric_resume_script.py; the same conversions as the Trainer's, see test_resume_anywhere_cpu.py and
test_cross_strategy_cpu.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import HERE, clean_environment

NAMES = ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"]
STEPS = 3
TOLERANCE = 1e-6


def _launch(runs):
    command = [sys.executable, str(HERE / "fabric_resume_script.py"), "--runs", json.dumps(runs)]
    result = subprocess.run(command, capture_output=True, text=True, env=clean_environment(), timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fabric-anywhere")
    spec = {name: {"strategy": name, "checkpoint": str(folder / f"{name}.ckpt")} for name in NAMES}
    _launch([{**spec[name], "devices": 2, "mode": "save", "out": str(folder / f"{name}-2.json")} for name in NAMES])
    _launch([{**spec[name], "devices": 1, "mode": "resume", "out": str(folder / f"{name}-1.json")} for name in NAMES])
    return {
        name: [json.loads((folder / f"{name}-{devices}.json").read_text()) for devices in (2, 1)] for name in NAMES
    } | {"folder": folder}


@pytest.mark.parametrize("name", NAMES)
def test_fabric_load_on_another_number_of_processes_continues_the_run(reports, name):
    uninterrupted, resumed = reports[name]
    assert resumed["step"] == 2 * STEPS  # the user's state came back
    assert resumed["engine_steps"] == uninterrupted["engine_steps"]  # DeepSpeed's own count (Fabric leaves it 0)
    # The resumed model started from other weights: equal losses need the weights, Adam's moments and its step
    # count (bias correction) restored.
    assert resumed["losses"] == pytest.approx(uninterrupted["losses"][STEPS:], rel=TOLERANCE, abs=TOLERANCE)
    assert (reports["folder"] / f"{name}.ckpt" / "checkpoint-universal" / "latest_universal").is_file()


def test_fabric_load_goes_between_zero_1_2_and_3_on_another_number_of_processes(reports):
    """A ZeRO-2 folder under deepspeed_stage_3 and a ZeRO-3 folder under deepspeed_stage_1, each saved on 2 processes
    and loaded on 1: read as another strategy's, through the one-file form and universal layout kept inside it."""
    folder = reports["folder"]
    pairs = {
        "deepspeed_stage_3": "deepspeed_stage_2",
        "deepspeed_stage_1": "deepspeed_stage_3",
    }  # loads under: saved by
    weights_alone = {
        "strategy": "deepspeed_stage_3",
        "devices": 1,
        "mode": "resume-weights",
        "checkpoint": str(folder / "deepspeed_stage_2.ckpt"),
        "out": str(folder / "weights-alone.json"),
    }
    resumes = [{"strategy": name, "devices": 1, "mode": "resume", "checkpoint": str(folder / f"{saved}.ckpt"),
                "out": str(folder / f"{saved}-under-{name}.json")} for name, saved in pairs.items()]  # fmt: skip
    _launch([*resumes, weights_alone])
    for name, saved in pairs.items():
        uninterrupted = reports[saved][0]
        resumed = json.loads((folder / f"{saved}-under-{name}.json").read_text())
        assert resumed["step"] == 2 * STEPS, name
        assert resumed["losses"] == pytest.approx(uninterrupted["losses"][STEPS:], rel=1e-5, abs=1e-6), name
        assert (folder / f"{saved}.ckpt" / "full.ckpt").is_file()
    # Without the optimizer in the state, the weights alone (and the user's entries): the same first loss.
    weights = json.loads((folder / "weights-alone.json").read_text())
    assert weights["step"] == 2 * STEPS
    assert weights["losses"][0] == pytest.approx(reports["deepspeed_stage_2"][0]["losses"][STEPS], rel=1e-5, abs=1e-6)


def test_fabric_load_of_what_ddp_saved_goes_on_under_zero3(tmp_path):
    """ddp's fabric.save (torch's Adam states by position) loads under deepspeed_stage_3 with its Adam moments and
    the user's step, through a universal form written for the load and removed after; or its weights alone."""
    checkpoint = str(tmp_path / "ddp.ckpt")
    _launch(
        [{"strategy": "ddp", "devices": 2, "mode": "save", "checkpoint": checkpoint, "out": str(tmp_path / "ddp.json")}]
    )
    resumes = [{"strategy": "deepspeed_stage_3", "devices": 2, "mode": mode, "checkpoint": checkpoint} for mode in
               ("resume", "resume-weights")]  # fmt: skip
    _launch([{**resume, "out": str(tmp_path / f"{resume['mode']}.json")} for resume in resumes])
    uninterrupted, resumed, weights_alone = (
        json.loads((tmp_path / f"{name}.json").read_text()) for name in ("ddp", "resume", "resume-weights")
    )
    assert resumed["step"] == weights_alone["step"] == 2 * STEPS
    assert resumed["losses"] == pytest.approx(uninterrupted["losses"][STEPS:], rel=1e-5, abs=1e-6)
    # The same weights give the same first loss; a fresh Adam then takes other steps.
    assert weights_alone["losses"][0] == pytest.approx(uninterrupted["losses"][STEPS], rel=1e-5, abs=1e-6)
    assert weights_alone["losses"][1:] != pytest.approx(uninterrupted["losses"][STEPS + 1 :], rel=1e-5, abs=1e-6)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "ddp.ckpt",
        "ddp.json",
        "resume-weights.json",
        "resume.json",
    ]


def test_fabric_load_goes_between_zero3_and_fsdp_both_ways_on_another_number_of_processes(tmp_path):
    """ZeRO-3's folder under fsdp (through its one-file form, kept inside the folder) and FSDP2's DCP folder under
    deepspeed_stage_3 (through a universal form removed after), each saved on 2 processes and loaded on 1."""
    pytest.importorskip("lightning_strategies_fsdp")  # else "fsdp" is Lightning's own strategy
    saved = {name: str(tmp_path / f"{name}.ckpt") for name in ("deepspeed_stage_3", "fsdp")}
    pairs = list(zip(saved, reversed(saved), strict=True))  # (loads under, saved by)
    _launch([{"strategy": name, "devices": 2, "mode": "save", "checkpoint": saved[name],
              "out": str(tmp_path / f"{name}.json")} for name in saved])  # fmt: skip
    _launch([{"strategy": name, "devices": 1, "mode": "resume", "checkpoint": saved[other],
              "out": str(tmp_path / f"{name}-resumed.json")} for name, other in pairs])  # fmt: skip
    for name, other in pairs:
        uninterrupted = json.loads((tmp_path / f"{other}.json").read_text())
        resumed = json.loads((tmp_path / f"{name}-resumed.json").read_text())
        assert resumed["step"] == 2 * STEPS, name
        assert resumed["losses"] == pytest.approx(uninterrupted["losses"][STEPS:], rel=1e-5, abs=1e-6), name
    assert (tmp_path / "deepspeed_stage_3.ckpt" / "full.ckpt").is_file()
    assert sorted(path.name for path in tmp_path.iterdir() if not path.name.endswith(".json")) == [
        "deepspeed_stage_3.ckpt",
        "fsdp.ckpt",
    ]  # the universal form was removed after the load
