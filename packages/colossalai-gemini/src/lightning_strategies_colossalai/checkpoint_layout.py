"""How a sharded ColossalAI checkpoint looks on disk, for core's ``identify`` (the plugin's
``checkpoint_formats`` hook), so that any strategy handed one can say it is ColossalAI's and what to do."""

from __future__ import annotations

from pathlib import Path

from lightning_strategies.checkpoints import CheckpointFormat
from lightning_strategies_colossalai.sharded_checkpoint import META_FILE, MODEL_FOLDER


def is_colossalai_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / META_FILE).is_file() and (path / MODEL_FOLDER).is_dir()


COLOSSALAI = CheckpointFormat(
    "colossalai",
    "a ColossalAI sharded checkpoint folder (meta.pt beside a model/ folder)",
    'the colossalai strategies (strategy="colossalai", from lightning-strategies-colossalai-gemini)',
    "load it with a colossalai strategy and save it again with state_dict_type='full': one file of full weights",
    is_colossalai_checkpoint,
    read_weights="lightning_strategies_colossalai.sharded_checkpoint:read_weights",
)
