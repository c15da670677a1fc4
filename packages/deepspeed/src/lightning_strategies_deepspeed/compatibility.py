"""Whether a saved DeepSpeed checkpoint fits this run, decided before DeepSpeed reads it.

DeepSpeed's own loader meets a truncated file with torch's zip error, a checkpoint of another
ZeRO stage with a bare ``AssertionError`` or ``FileNotFoundError``, and another number of
processes with an error from inside its optimizer. Here each becomes a ``CheckpointError``
that says what the checkpoint is and what to do with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import check_file

# One file per data-parallel rank: "bf16_" when the optimizer kept bf16 weights.
_OPTIMIZER_STATES = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_PARTITIONED_MODEL_STATES = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$")
_CONVERT = "python -m lightning_strategies_deepspeed.convert"


@dataclass(frozen=True)
class EngineLayout:
    """How this run's engine splits what it saves; the checkpoint must be split the same way."""

    world_size: int
    stage: int
    partitioned_parameters: bool  # ZeRO-3: every rank writes its own model-states file
    partitioned_optimizer: bool  # every rank writes its own part of the optimizer state

    @classmethod
    def of(cls, engine: Any, world_size: int) -> EngineLayout:
        return cls(
            world_size=world_size,
            stage=int(engine.zero_optimization_stage()),
            partitioned_parameters=bool(engine.zero_optimization_partition_weights()),
            # DeepSpeed's own test for writing one optimizer-state file per rank.
            partitioned_optimizer=hasattr(engine.optimizer, "dp_process_group"),
        )


@dataclass(frozen=True)
class SavedLayout:
    """How a saved checkpoint was split: its file names, and what DeepSpeed recorded with rank 0's state."""

    world_size: int
    stage: int | None  # None where the checkpoint did not record its config
    parameter_ranks: tuple[int, ...]
    optimizer_ranks: tuple[int, ...]

    @classmethod
    def of(cls, tag_folder: Path, rank_0_state: Mapping[str, Any]) -> SavedLayout:
        names = [path.name for path in tag_folder.iterdir()]
        parameter_ranks = _ranks(_PARTITIONED_MODEL_STATES, names)
        optimizer_ranks = _ranks(_OPTIMIZER_STATES, names)
        recorded = rank_0_state.get("dp_world_size")
        world_size = int(recorded) if recorded else max(len(parameter_ranks), len(optimizer_ranks), 1)
        config = rank_0_state.get("ds_config")
        stage = int((config.get("zero_optimization") or {}).get("stage", 0)) if isinstance(config, Mapping) else None
        return cls(world_size, stage, parameter_ranks, optimizer_ranks)

    def describe(self) -> str:
        processes = f"{self.world_size} process{'es' if self.world_size != 1 else ''}"
        stage = "ZeRO stage 1 or 2" if self.stage is None else f"ZeRO stage {self.stage}"
        if self.parameter_ranks:
            return f"with ZeRO stage 3 on {processes} (each wrote its part of the parameters)"
        if self.optimizer_ranks:
            return f"with {stage} on {processes}, each writing its part of the optimizer state"
        return f"with {'ZeRO stage 0' if self.stage is None else stage}, the whole optimizer state in one file"


def check_saved_files(tag_folder: Path) -> None:
    """Refuse missing, empty and truncated files in a tag folder (a universal one included).

    Every rank checks every file, so that all ranks refuse together instead of one raising while
    the others wait for it inside a collective. A file's checksums are verified by the rank that reads it
    (``read_saved_file``): verified here, every file would be read by every rank.
    """
    for path in sorted([*tag_folder.glob("*.pt"), *tag_folder.glob("zero/*/*.pt")]):
        check_file(path, verify=False)  # the legacy (non-zip) format of checkpoint_serialization=False included


def check_complete(directory: Path, tag: str, layout: SavedLayout) -> None:
    """Every rank's files are there: a checkpoint copied only in part is named as such."""
    tag_folder = directory / tag
    for kind, ranks in (("model-states", layout.parameter_ranks), ("optimizer-state", layout.optimizer_ranks)):
        missing = sorted(set(range(layout.world_size)) - set(ranks))
        if ranks and missing:
            raise CheckpointError(
                f"The DeepSpeed checkpoint {directory} is incomplete: {tag_folder} has no {kind} file of rank(s) "
                f"{', '.join(map(str, missing))} of {layout.world_size}. It was copied or synced only in part: "
                "copy it again from where it was written, or resume from an earlier checkpoint."
            )


def check_fits(directory: Path, layout: SavedLayout, engine: EngineLayout, restores_optimizer: bool) -> None:
    """Refuse a checkpoint that this run's engine cannot load, before DeepSpeed fails on it. Another number of
    processes is not refused here: the strategies convert such a checkpoint to the universal layout first."""
    weights_route = (
        f"or start from its weights alone: `{_CONVERT} {directory} weights.ckpt`, then "
        "DeepSpeedStrategy(load_full_weights=True) with ckpt_path='weights.ckpt' (the optimizer starts afresh)"
    )
    saved_stage_3 = bool(layout.parameter_ranks)
    if saved_stage_3 != engine.partitioned_parameters:
        saved_stage = layout.stage if layout.stage is not None else ("3" if saved_stage_3 else "0, 1 or 2")
        raise CheckpointError(
            f"The DeepSpeed checkpoint {directory} was saved {layout.describe()}, and this run uses ZeRO stage "
            f"{engine.stage}: DeepSpeed cannot load one into the other. Resume with ZeRO stage {saved_stage}, "
            f"{weights_route}."
        )
    if not restores_optimizer:
        return
    if bool(layout.optimizer_ranks) != engine.partitioned_optimizer:
        here = "partitions the optimizer state" if engine.partitioned_optimizer else "keeps the optimizer state whole"
        raise CheckpointError(
            f"The DeepSpeed checkpoint {directory} was saved {layout.describe()}, and this run {here} (ZeRO stage "
            f"{engine.stage}): DeepSpeed cannot restore one from the other. Resume with the ZeRO settings it was "
            f"saved with, {weights_route}."
        )


def _ranks(pattern: re.Pattern[str], names: list[str]) -> tuple[int, ...]:
    return tuple(sorted({int(match.group(1)) for name in names if (match := pattern.match(name))}))
