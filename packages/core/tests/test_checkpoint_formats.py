"""Each layout this project writes is recognised, and refusing one says who reads it and how to convert."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_strategies.checkpoints import (
    COLOSSALAI,
    DCP,
    DEEPSPEED,
    FILE,
    XLA_FSDP,
    foreign_checkpoint_error,
    identify,
)


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


@pytest.fixture
def layouts(tmp_path: Path) -> dict[str, Path]:
    deepspeed = tmp_path / "deepspeed.ckpt"
    touch(deepspeed / "latest")
    touch(deepspeed / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt")
    dcp = tmp_path / "fsdp.ckpt"
    touch(dcp / ".metadata")
    touch(dcp / "__0_0.distcp")
    colossalai = tmp_path / "colossalai.ckpt"
    touch(colossalai / "meta.pt")
    touch(colossalai / "model" / "pytorch_model.bin.index.json")
    xla_fsdp = tmp_path / "xla.ckpt"
    touch(xla_fsdp / "checkpoint_rank-00000000-of-00000002.pth")
    single = tmp_path / "full.ckpt"
    torch.save({"state_dict": {}}, single)
    return {"deepspeed": deepspeed, "dcp": dcp, "colossalai": colossalai, "xla_fsdp": xla_fsdp, "file": single}


def test_every_layout_is_identified(layouts: dict[str, Path]) -> None:
    assert identify(layouts["deepspeed"]) is DEEPSPEED
    assert identify(layouts["deepspeed"] / "checkpoint") is DEEPSPEED
    assert identify(next((layouts["deepspeed"] / "checkpoint").iterdir())) is DEEPSPEED
    assert identify(layouts["dcp"]) is DCP
    assert identify(layouts["colossalai"]) is COLOSSALAI
    assert identify(layouts["xla_fsdp"]) is XLA_FSDP
    assert identify(layouts["file"]) is FILE


def test_unknown_paths_are_not_guessed(tmp_path: Path) -> None:
    assert identify(tmp_path / "missing") is None
    assert identify(tmp_path) is None  # an empty folder
    assert identify(touch(tmp_path / "notes.txt")) is None  # not a torch.save file


def test_the_error_names_the_format_its_reader_and_the_conversion(layouts: dict[str, Path]) -> None:
    error = foreign_checkpoint_error(layouts["deepspeed"], "FSDP2Strategy", "a DCP folder or one full file")
    message = str(error)
    assert "is a DeepSpeed checkpoint (a folder" in message
    assert "FSDP2Strategy reads a DCP folder or one full file" in message
    assert f"python -m lightning_strategies_deepspeed.convert {layouts['deepspeed']} full.ckpt" in message


def test_an_unknown_layout_says_to_check_the_path(tmp_path: Path) -> None:
    message = str(foreign_checkpoint_error(tmp_path, "DeepSpeedStrategy", "a DeepSpeed folder"))
    assert "no checkpoint layout this project knows" in message and "Check the path" in message
