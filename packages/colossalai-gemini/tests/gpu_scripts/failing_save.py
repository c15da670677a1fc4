"""A checkpoint write that fails half way on every rank alike (a full disk), for the GPU tests.

Sharded: the model shards are written, then ColossalAI's optimizer-shard write fails. Full: rank 0
writes half of the file where the strategy asked, then the write fails. Every rank raises, so none
waits in a barrier for another.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from lightning.pytorch.strategies import DDPStrategy

DISK_FULL = "No space left on device"


@contextlib.contextmanager
def disk_full_half_way(strategy: Any) -> Iterator[None]:
    if strategy.settings.state_dict_type == "sharded":

        def fail_after_model(*args: Any, **kwargs: Any) -> None:
            raise OSError(28, f"{DISK_FULL} (simulated, after the model shards were written)")

        gemini_io = type(strategy._gemini_plugin.get_checkpoint_io())
        with mock.patch.object(gemini_io, "save_sharded_optimizer", fail_after_model):
            yield
        return

    def write_half(self: Any, checkpoint: dict, filepath: Any, storage_options: Any = None) -> None:
        if self.is_global_zero:
            torch.save(checkpoint, filepath)
            Path(filepath).write_bytes(Path(filepath).read_bytes()[: Path(filepath).stat().st_size // 2])
        raise OSError(28, f"{DISK_FULL} (simulated, half the file written)")

    # ColossalAIStrategy.save_checkpoint hands the write to DDPStrategy's (Lightning's CheckpointIO on rank 0).
    with mock.patch.object(DDPStrategy, "save_checkpoint", write_half):
        yield


def digests(path: Path) -> dict[str, str]:
    """SHA-256 of the checkpoint file, or of every file in the checkpoint folder."""
    files = [path] if path.is_file() else sorted(item for item in path.rglob("*") if item.is_file())
    return {str(file.relative_to(path.parent)): hashlib.sha256(file.read_bytes()).hexdigest() for file in files}
