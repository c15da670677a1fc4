"""How a sharded ColossalAI checkpoint looks on disk, for core's ``identify`` (the plugin's
``checkpoint_formats`` hook), so that any strategy handed one can say it is ColossalAI's and what to do."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from lightning_strategies.checkpoints import CheckpointFormat
from lightning_strategies_colossalai.sharded_checkpoint import META_FILE, MODEL_FOLDER


def is_colossalai_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / META_FILE).is_file() and (path / MODEL_FOLDER).is_dir()


COLOSSALAI = CheckpointFormat(
    "colossalai",
    "a ColossalAI sharded checkpoint folder (meta.pt beside a model/ folder)",
    'the colossalai strategies (strategy="colossalai", from lightning-strategies-colossalai-gemini)',
    "`lightning-strategies convert {path} full.ckpt --to full` writes one file of its weights and optimizer states",
    is_colossalai_checkpoint,
    read_weights="lightning_strategies_colossalai.sharded_checkpoint:read_weights",
    to_full_checkpoint="lightning_strategies_colossalai.sharded_checkpoint:to_full_checkpoint",
    convert_name="colossalai",
    from_full_checkpoint="lightning_strategies_colossalai.checkpoint_layout:from_full_checkpoint",
)


def from_full_checkpoint(
    source: str | os.PathLike[str], destination: str | os.PathLike[str], weights_only: Any
) -> Path:
    """The ``from_full_checkpoint`` of the ColossalAI format: the file itself, copied once checked whole. The
    colossalai strategies load one full checkpoint file as it is (what they write with state_dict_type="full"), with
    optimizer states keyed by position or by parameter name, so that is the form of any other layout for them.
    """
    from lightning_strategies.checkpoints import load_file, staged_save

    load_file(source, weights_only, map_location="cpu", mmap=True)  # whole, and readable with weights_only
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with staged_save(destination) as staged:
        shutil.copyfile(source, staged)
    return destination
