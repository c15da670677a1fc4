"""Staging and checks for strategies that save through Lightning's CheckpointIO, in both Lightning
distributions (classes are matched by name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_strategies.checkpoints import (
    check_checkpoint_file,
    check_trainer_checkpoint,
    reads_torch_save_files,
    staged_checkpoint_io_save,
)
from lightning_strategies.checkpoints.checkpoint_io import writes_in_background
from lightning_strategies.errors import CheckpointError
from lightning_strategies.testing import written_by_another_package


class TorchCheckpointIO:  # stands for Lightning's, in either distribution
    pass


class AsyncCheckpointIO:
    def __init__(self, checkpoint_io: object) -> None:
        self.checkpoint_io = checkpoint_io


def test_background_writers_are_not_staged(tmp_path: Path) -> None:
    background = AsyncCheckpointIO(TorchCheckpointIO())
    assert writes_in_background(background) and not writes_in_background(TorchCheckpointIO())
    with staged_checkpoint_io_save(tmp_path / "last.ckpt", background, True, lambda: None) as path:
        assert path == tmp_path / "last.ckpt"  # publishing after the call would rename a file still being written
    with staged_checkpoint_io_save(tmp_path / "last.ckpt", TorchCheckpointIO(), True, lambda: None) as path:
        assert path != tmp_path / "last.ckpt"
        torch.save({"state_dict": {}}, path)
    assert (tmp_path / "last.ckpt").is_file()


def test_only_torch_save_files_are_checked_as_such() -> None:
    assert reads_torch_save_files(TorchCheckpointIO())
    assert reads_torch_save_files(AsyncCheckpointIO(TorchCheckpointIO()))
    assert not reads_torch_save_files(object())  # a plugin with its own format checks its own files


def test_a_folder_of_another_strategy_is_named(tmp_path: Path) -> None:
    # Core's tests run without any strategy package: the layout's package is stood in for.
    (tmp_path / "other.ckpt").mkdir()
    refused = pytest.raises(CheckpointError, match=r"another package's checkpoint.*another-package-convert")
    with written_by_another_package(tmp_path / "other.ckpt"), refused:
        check_checkpoint_file(tmp_path / "other.ckpt", TorchCheckpointIO(), "XLAStrategy")


def test_a_bare_state_dict_is_not_a_trainer_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no 'state_dict' entry.*model.load_state_dict"):
        check_trainer_checkpoint({"weight": torch.ones(1)}, tmp_path / "weights.pt")
    check_trainer_checkpoint({"state_dict": {}}, tmp_path / "model.ckpt")
