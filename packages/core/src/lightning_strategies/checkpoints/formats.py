"""What a checkpoint on disk is, by its layout, so that a strategy refusing it can say what to do.

Users move between strategies mid-project: a folder saved with FSDP2 handed to DeepSpeed fails
deep inside DeepSpeed ("Unable to find latest file"), a DeepSpeed folder handed to DCP fails with
"metadata is None". Every strategy package of this project asks ``identify`` first and, for a
format it cannot read, raises ``foreign_checkpoint_error`` naming the strategy that writes it and
how to turn it into a file of full weights that any strategy loads.

The layouts are those this project's packages write; the knowledge lives here, once, because
each package must recognise the others'.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from lightning_strategies.errors import CheckpointError

# DeepSpeed: a tag folder (named in `latest`) with one model-states file per model-parallel rank;
# ZeRO-3 prefixes it with the data-parallel rank (zero_pp_rank_0_mp_rank_00_model_states.pt).
_DEEPSPEED_MODEL_STATES = "*mp_rank_00_model_states.pt"
_DEEPSPEED_TAG_FILES = ("latest", "latest_universal")
# torch.distributed.checkpoint (FSDP2's sharded state dict) writes `.metadata` beside its shards.
_DCP_METADATA = ".metadata"
# ColossalAI sharded (lightning-strategies-colossalai-gemini): meta.pt beside model/ in its index format.
_COLOSSALAI_META, _COLOSSALAI_MODEL = "meta.pt", "model"
# XLA FSDP sharded (Fabric's xla_fsdp): one checkpoint_rank-<rank>-of-<world size>.pth per process.
_XLA_FSDP_SHARDS = "checkpoint_rank-*-of-*.pth"


@dataclass(frozen=True)
class CheckpointFormat:
    """A checkpoint layout: what it is, which strategies read it, how to get full weights from it."""

    key: str
    description: str
    read_by: str
    to_full_weights: str


DEEPSPEED = CheckpointFormat(
    "deepspeed",
    "a DeepSpeed checkpoint (a folder with a tag folder of per-rank *mp_rank_00_model_states.pt files, "
    "or one of those files)",
    'the deepspeed strategies (strategy="deepspeed_stage_2", ..., from lightning-strategies-deepspeed)',
    "`python -m lightning_strategies_deepspeed.convert {path} full.ckpt` writes one file of full fp32 weights",
)
DCP = CheckpointFormat(
    "dcp",
    "a sharded torch.distributed.checkpoint folder (FSDP2's state_dict_type='sharded')",
    'the fsdp strategies (strategy="fsdp", ..., from lightning-strategies-fsdp), on any number of processes',
    "`python -m lightning_strategies_fsdp.convert {path} full.ckpt` writes one file of full weights",
)
COLOSSALAI = CheckpointFormat(
    "colossalai",
    "a ColossalAI sharded checkpoint folder (meta.pt beside a model/ folder)",
    'the colossalai strategies (strategy="colossalai", from lightning-strategies-colossalai-gemini)',
    "load it with a colossalai strategy and save it again with state_dict_type='full': one file of full weights",
)
XLA_FSDP = CheckpointFormat(
    "xla_fsdp",
    "a sharded XLA FSDP checkpoint folder (one checkpoint_rank-<rank>-of-<world size>.pth per process)",
    "Fabric's xla_fsdp strategy (from lightning-strategies-xla), on as many processes as saved it",
    "`python -m torch_xla.distributed.fsdp.consolidate_sharded_ckpts --ckpt_prefix {path}/checkpoint "
    "--ckpt_suffix '_rank-*-of-*.pth' --save_path full.ckpt` writes one file of full weights",
)
FILE = CheckpointFormat(
    "file",
    "a single torch.save checkpoint file (written by ddp, by FSDP2 and ColossalAI with state_dict_type='full', "
    "and by the convert tools)",
    "every strategy that loads full weights",
    "it already holds full weights",
)


def identify(path: str | Path) -> CheckpointFormat | None:
    """The format of the checkpoint at ``path``, or None where no known layout is there."""
    path = Path(path)
    if path.is_file():
        if path.match(_DEEPSPEED_MODEL_STATES):
            return DEEPSPEED  # a file from inside a DeepSpeed tag folder
        return FILE if zipfile.is_zipfile(path) else None
    if not path.is_dir():
        return None
    if (path / _DCP_METADATA).is_file():
        return DCP
    if (path / _COLOSSALAI_META).is_file() and (path / _COLOSSALAI_MODEL).is_dir():
        return COLOSSALAI
    if any(path.glob(_XLA_FSDP_SHARDS)):
        return XLA_FSDP
    if any(path.glob(_DEEPSPEED_MODEL_STATES)):
        return DEEPSPEED  # the tag folder itself
    has_tag_file = any((path / name).is_file() for name in _DEEPSPEED_TAG_FILES)
    if has_tag_file and any(path.glob(f"*/{_DEEPSPEED_MODEL_STATES}")):
        return DEEPSPEED
    return None


def foreign_checkpoint_error(path: str | Path, strategy: str, here: str) -> CheckpointError:
    """The error for a checkpoint ``strategy`` cannot read; ``here`` says what it does accept.

    Example: ``here="a DeepSpeed checkpoint folder, or one full-weights file with load_full_weights=True"``.
    """
    found = identify(path)
    if found is None:
        what = f"{path} is no checkpoint layout this project knows"
        fix = "Check the path: it should be what a strategy's save_checkpoint (or ModelCheckpoint) wrote."
    else:
        what = f"{path} is {found.description}"
        fix = f"Resume it with {found.read_by}. To load its weights here: {found.to_full_weights.format(path=path)}."
    return CheckpointError(f"{what}, and {strategy} reads {here}. {fix}")
