"""Naming a checkpoint that is not a DeepSpeed one, so that refusing it can say how to use it.

Users move between strategies mid-project: a run saved with FSDP or ColossalAI, or a single
Lightning file, handed to a DeepSpeed strategy should meet "this is X; do Y", not DeepSpeed's
"Unable to find latest file" followed by a failure elsewhere.
"""

from __future__ import annotations

from pathlib import Path

_FULL_WEIGHTS = "DeepSpeedStrategy(load_full_weights=True) (the optimizer state starts afresh)"


def describe(path: Path) -> str | None:
    """What ``path`` holds and how a DeepSpeed strategy can use it, or None where it is no known format."""
    if path.is_file():
        return (
            f"{path} is a single checkpoint file (what Lightning writes for ddp, for FSDP and ColossalAI with full "
            f"state dicts, and what `python -m lightning_strategies_deepspeed.convert` writes), not a DeepSpeed "
            f"checkpoint directory. To start from its weights, use {_FULL_WEIGHTS}."
        )
    if not path.is_dir():
        return None
    if path.joinpath(".metadata").is_file():
        return (
            f"{path} is a sharded torch.distributed.checkpoint folder (FSDP's state_dict_type='sharded'), not a "
            f"DeepSpeed checkpoint. Convert it to one file with `python -m lightning_strategies_fsdp.convert {path} "
            f"full.ckpt` (from lightning-strategies-fsdp) and load that with {_FULL_WEIGHTS}."
        )
    if path.joinpath("meta.pt").is_file() and path.joinpath("model").is_dir():
        return (
            f"{path} is a ColossalAI sharded checkpoint (state_dict_type='sharded'), not a DeepSpeed checkpoint. "
            "Load it with the colossalai strategy and save it again with state_dict_type='full', then load that "
            f"file with {_FULL_WEIGHTS}."
        )
    return None
