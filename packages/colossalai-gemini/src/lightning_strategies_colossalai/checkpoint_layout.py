"""How a sharded ColossalAI checkpoint looks on disk, for core's ``identify`` (the plugin's
``checkpoint_formats`` hook), so that any strategy handed one can say it is ColossalAI's and what to do."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from lightning_strategies import CheckpointError
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
    convert_name="colossalai",
    from_full_checkpoint="lightning_strategies_colossalai.checkpoint_layout:from_full_checkpoint",
)


def from_full_checkpoint(
    source: str | os.PathLike[str], destination: str | os.PathLike[str], weights_only: Any
) -> Path:
    """The ``from_full_checkpoint`` of the ColossalAI format: the file itself, copied once checked whole. The
    colossalai strategies load one full checkpoint file as it is (what they write with state_dict_type="full"), so that
    is the form of any other layout for them.

    Refused where the file's optimizer states are keyed by name (FSDP2's, and its converter's): ColossalAI's
    optimizers look their states up by parameter position, as they and torch save them, and would find none.
    """
    from lightning_strategies.checkpoints import load_file, staged_save

    checkpoint = load_file(source, weights_only, map_location="cpu", mmap=True)
    for optimizer in checkpoint.get("optimizer_states") or []:
        named = [key for key in (optimizer.get("state") or {}) if isinstance(key, str)]
        if named:
            raise CheckpointError(
                f"{source} holds optimizer states keyed by name ({', '.join(named[:3])}, ...), as FSDP2 and its "
                "converter write them; ColossalAI's optimizers look states up by parameter position and would restore "
                "none. Add --drop-optimizer-states for the weights and Lightning's state alone (the optimizer starts "
                "afresh), or resume it under the strategy that saved it."
            )
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with staged_save(destination) as staged:
        shutil.copyfile(source, staged)
    return destination
