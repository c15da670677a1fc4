"""How a sharded FSDP2 checkpoint looks on disk, for core's ``identify`` (the plugin's ``checkpoint_formats``
hook), so that any strategy handed one can say it is a DCP folder and how to convert it."""

from __future__ import annotations

from pathlib import Path

from lightning_strategies.checkpoints import CheckpointFormat

# torch.distributed.checkpoint writes its index, `.metadata`, beside the shards.
DCP_INDEX = ".metadata"


def is_dcp_folder(path: Path) -> bool:
    return path.is_dir() and (path / DCP_INDEX).is_file()


DCP = CheckpointFormat(
    "dcp",
    "a sharded torch.distributed.checkpoint folder (FSDP2's state_dict_type='sharded')",
    'the fsdp strategies (strategy="fsdp", ..., from lightning-strategies-fsdp), on any number of processes',
    "`python -m lightning_strategies_fsdp.convert {path} full.ckpt` writes one file of full weights",
    is_dcp_folder,
    read_weights="lightning_strategies_fsdp.checkpoint:read_weights",
    to_full_checkpoint="lightning_strategies_fsdp.checkpoint:sharded_to_full",
    convert_name="fsdp",
    from_full_checkpoint="lightning_strategies_fsdp.checkpoint:full_to_sharded",
)
