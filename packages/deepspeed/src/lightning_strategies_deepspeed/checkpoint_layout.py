"""How a DeepSpeed checkpoint looks on disk, for core's ``identify`` (the plugin's ``checkpoint_formats`` hook),
so that any strategy handed one can say it is DeepSpeed's and how to convert it."""

from __future__ import annotations

from pathlib import Path

from lightning_strategies.checkpoints import CheckpointFormat

# A tag folder (named in `latest`) with one model-states file per model-parallel rank; ZeRO-3 prefixes
# it with the data-parallel rank (zero_pp_rank_0_mp_rank_00_model_states.pt).
MODEL_STATES = "*mp_rank_00_model_states.pt"
TAG_FILES = ("latest", "latest_universal")
# The universal form of tag folder T that a resume on another number of processes writes beside it (universal.py).
CONVERTED_SUFFIX = "-universal"


def is_deepspeed_checkpoint(path: Path) -> bool:
    """A checkpoint folder (tag files beside tag folders), a tag folder, or one model-states file of one."""
    if path.is_file():
        return path.match(MODEL_STATES)
    if not path.is_dir():
        return False
    if any(path.glob(MODEL_STATES)):
        return True
    has_tag_file = any((path / name).is_file() for name in TAG_FILES)
    return has_tag_file and any(path.glob(f"*/{MODEL_STATES}"))


DEEPSPEED = CheckpointFormat(
    "deepspeed",
    "a DeepSpeed checkpoint (a folder with a tag folder of per-rank *mp_rank_00_model_states.pt files, "
    "or one of those files)",
    'the deepspeed strategies (strategy="deepspeed_stage_2", ..., from lightning-strategies-deepspeed)',
    "`python -m lightning_strategies_deepspeed.convert {path} full.ckpt` writes one file of full fp32 weights",
    is_deepspeed_checkpoint,
    read_weights="lightning_strategies_deepspeed.checkpoint:read_weights",
    # One file with the Adam moments by parameter name, through DeepSpeed's universal layout.
    to_full_checkpoint="lightning_strategies_deepspeed.to_full:to_full_checkpoint",
    convert_name="deepspeed",
    # A universal folder (ZeRO stage 1 and 2) from one file with torch Adam states: what maps exactly, or refused.
    from_full_checkpoint="lightning_strategies_deepspeed.from_full:from_full_checkpoint",
    derived=(f"*{CONVERTED_SUFFIX}",),
)
