"""XLA FSDP checkpoints (Fabric's ``xla_fsdp``), checked before Lightning reads them.

``state_dict_type="sharded"`` writes a folder with one file per process,
``checkpoint_rank-<rank>-of-<world size>.pth``, each holding that process's slice of the flattened
parameters: it loads only on as many processes. ``"full"`` writes one consolidated file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import check_file, foreign_checkpoint_error, is_local

_SHARD = re.compile(r"checkpoint_rank-(\d+)-of-(\d+)\.pth")
_READS = "folders of checkpoint_rank-*-of-*.pth shards (state_dict_type='sharded') or one consolidated file ('full')"


def consolidate_command(folder: Path) -> str:
    return (
        "`python -m torch_xla.distributed.fsdp.consolidate_sharded_ckpts "
        f"--ckpt_prefix {folder}/checkpoint --ckpt_suffix '_rank-*-of-*.pth' --save_path consolidated.ckpt`"
    )


def check_xla_fsdp_checkpoint(path: Path, state_dict_type: str, world_size: int) -> None:
    """Refuse a checkpoint this run cannot load, saying why and what to do, before any shard is read."""
    if state_dict_type == "full":
        _check_full(path)
    else:
        _check_sharded(path, world_size)


def _check_full(path: Path) -> None:
    if path.is_dir() and _has_shards(path):
        raise CheckpointError(
            f"{path} is a sharded XLA FSDP checkpoint (one file per process), but this strategy has "
            "state_dict_type='full'. Load it with XLAFSDPStrategy(state_dict_type='sharded') on as many "
            f"processes as saved it, or consolidate it into one file with {consolidate_command(path)}."
        )
    if path.is_dir():
        _refuse_folder(path)
    check_file(path)


def _check_sharded(path: Path, world_size: int) -> None:
    if path.is_file():
        raise CheckpointError(
            f"{path} is one file (a full checkpoint), but this strategy has state_dict_type='sharded'. "
            "Load it with XLAFSDPStrategy(state_dict_type='full')."
        )
    if not path.is_dir():
        raise CheckpointError(f"No checkpoint at {path}. Check the path, or list the folder for the ones there.")
    shards = {item: _SHARD.fullmatch(item.name) for item in path.iterdir()}
    ranks = {int(match[1]): int(match[2]) for match in shards.values() if match}
    if not ranks:
        _refuse_folder(path)
    saved_world_sizes = set(ranks.values())
    if len(saved_world_sizes) > 1:
        raise CheckpointError(
            f"{path} mixes shards of runs on {sorted(saved_world_sizes)} processes; a checkpoint folder holds "
            "one run's shards. Resume from another checkpoint, or remove the shards of the other run."
        )
    saved = saved_world_sizes.pop()
    if saved != world_size:
        raise CheckpointError(
            f"{path} was saved by {saved} processes and this run has {world_size}: each XLA FSDP shard holds "
            f"one process's slice of the flattened parameters, so it loads only on {saved} processes. Run on "
            f"{saved} devices, or consolidate it with {consolidate_command(path)} and load consolidated.ckpt "
            "with XLAFSDPStrategy(state_dict_type='full') (model weights only)."
        )
    missing = sorted(set(range(saved)) - set(ranks))
    if missing:
        raise CheckpointError(
            f"{path} lacks the shards of ranks {missing} (of {saved}): it is incomplete (files were removed, or "
            "it was copied in part). Resume from an earlier checkpoint, or copy the missing files."
        )
    for item in sorted(item for item, match in shards.items() if match):
        check_file(item)


def refuse_xla_fsdp_shards(path: Any, strategy: str) -> None:
    """For strategies that load one file: name a sharded XLA FSDP folder and how to load it."""
    if not is_local(path) or not Path(path).is_dir() or not _has_shards(Path(path)):
        return
    raise CheckpointError(
        f"{path} is a sharded XLA FSDP checkpoint (one file per process, from Fabric's xla_fsdp), and {strategy} "
        "reads one checkpoint file. Load it with Fabric(strategy='xla_fsdp') on as many processes as saved it, "
        f"or consolidate its model weights into one file with {consolidate_command(Path(path))}."
    )


def _has_shards(folder: Path) -> bool:
    return any(_SHARD.fullmatch(item.name) for item in folder.iterdir())


def _refuse_folder(path: Path) -> None:
    raise foreign_checkpoint_error(path, "XLAFSDPStrategy", here=_READS)
