"""How a sharded XLA FSDP checkpoint looks on disk, for core's ``identify`` (the plugin's ``checkpoint_formats``
hook), so that any strategy handed one can say it is XLA FSDP's and how to consolidate it."""

from __future__ import annotations

from pathlib import Path

from lightning_strategies.checkpoints import CheckpointFormat

# Fabric's xla_fsdp writes one checkpoint_rank-<rank>-of-<world size>.pth per process.
SHARD_FILES = "checkpoint_rank-*-of-*.pth"


def is_xla_fsdp_checkpoint(path: Path) -> bool:
    return path.is_dir() and any(path.glob(SHARD_FILES))


XLA_FSDP = CheckpointFormat(
    "xla_fsdp",
    "a sharded XLA FSDP checkpoint folder (one checkpoint_rank-<rank>-of-<world size>.pth per process)",
    "Fabric's xla_fsdp strategy (from lightning-strategies-xla), on as many processes as saved it",
    "`python -m torch_xla.distributed.fsdp.consolidate_sharded_ckpts --ckpt_prefix {path}/checkpoint "
    "--ckpt_suffix '_rank-*-of-*.pth' --save_path full.ckpt` writes one file of full weights",
    is_xla_fsdp_checkpoint,
)
