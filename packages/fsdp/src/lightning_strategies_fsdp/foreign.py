"""Name checkpoints that other strategies wrote, so that loading one here says what it is and what to do.

Handed to DCP, a DeepSpeed or ColossalAI checkpoint folder fails with "metadata is None" deep in a
read; recognised by its layout first, it gets the strategy that reads it and the way to convert it.
Generic across this project's packages: a candidate for core.
"""

from __future__ import annotations

from pathlib import Path

# DeepSpeed writes one model-states file per model-parallel rank in a tag folder named by `latest`;
# ZeRO-3 prefixes it with the data-parallel rank (zero_pp_rank_0_mp_rank_00_model_states.pt).
_DEEPSPEED_MODEL_STATES = "*mp_rank_00_model_states.pt"
_DEEPSPEED_TAG_FILES = ("latest", "latest_universal")
# ColossalAI's sharded checkpoints (lightning-strategies-colossalai-gemini): meta.pt beside a model/
# folder in ColossalAI's index format, and no DCP .metadata.
_COLOSSALAI_MODEL_FOLDER = "model"
_COLOSSALAI_META_FILE = "meta.pt"


def describe_foreign(path: Path) -> str | None:
    """What another strategy's checkpoint at ``path`` is and how to use it; None if it is not one."""
    if is_deepspeed_checkpoint(path):
        return (
            f"{path} is a DeepSpeed checkpoint (a tag folder of per-rank *mp_rank_00_model_states.pt files), not "
            'an FSDP2 one. Resume it with a DeepSpeed strategy (strategy="deepspeed", from '
            "lightning-strategies-deepspeed), or convert it into one file of full fp32 weights with "
            f"`python -m lightning_strategies_deepspeed.convert {path} model.ckpt`: that file loads here for "
            "validate/test/predict and with Model.load_from_checkpoint, but holds no optimizer state to resume "
            "fit from."
        )
    if is_colossalai_checkpoint(path):
        return (
            f"{path} is a ColossalAI sharded checkpoint ({_COLOSSALAI_META_FILE} beside a "
            f"{_COLOSSALAI_MODEL_FOLDER}/ folder in ColossalAI's index format), not an FSDP2 one. Resume it with a "
            'ColossalAI strategy (strategy="colossalai", from lightning-strategies-colossalai-gemini); to take its '
            'weights elsewhere, load it there and save with state_dict_type="full": that single file loads with '
            "Model.load_from_checkpoint, without ColossalAI."
        )
    return None


def is_deepspeed_checkpoint(path: Path) -> bool:
    """A DeepSpeed checkpoint folder, one of its tag folders, or a model-states file from inside one."""
    if path.is_file():
        return path.match(_DEEPSPEED_MODEL_STATES)
    if not path.is_dir():
        return False
    if any(path.glob(_DEEPSPEED_MODEL_STATES)):
        return True  # the tag folder itself
    has_tag_file = any((path / name).is_file() for name in _DEEPSPEED_TAG_FILES)
    return has_tag_file and any(path.glob(f"*/{_DEEPSPEED_MODEL_STATES}"))


def is_colossalai_checkpoint(path: Path) -> bool:
    return (path / _COLOSSALAI_META_FILE).is_file() and (path / _COLOSSALAI_MODEL_FOLDER).is_dir()
