"""Resuming a ZeRO checkpoint on another number of processes, by ``ckpt_path`` alone (issue 29, item 1).

A ZeRO checkpoint splits the optimizer state (and, at stage 3, the parameters) by the number of
processes that saved it; DeepSpeed restores it on that number only. Met with another number, the
checkpoint is converted once into DeepSpeed's universal layout, which DeepSpeed loads on any number,
and the universal form is kept inside the checkpoint directory, beside its tag folder::

    epoch=0.ckpt/latest
    epoch=0.ckpt/checkpoint/                  what was saved, never written to
    epoch=0.ckpt/checkpoint-universal/        latest_universal, checkpoint_universal/, source.json

Global rank 0 converts (DeepSpeed's ds_to_universal, in a process of its own, with one worker per
process of this machine: the other ranks wait meanwhile, so their cores are free) while the other ranks
wait for its answer in a broadcast. It writes into a hidden staging folder and renames it into place
once whole, so a conversion killed or failed half way leaves nothing under the name. ``source.json``
records the size and modification time of every saved file: the next resume on any number of processes
reuses the universal form while it matches, and converts again when the checkpoint was replaced. A
re-save into the directory replaces the directory, universal form included. Jobs resuming one checkpoint at
once take turns (core's ``one_conversion_at_a_time``): the second reuses what the first converted. A checkpoint
folder that cannot be written here gets its universal form in a scratch folder beside it instead, for that resume
alone, removed once every rank has loaded it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_info

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import (
    cannot_write,
    files_fingerprint,
    form_for_the_load,
    one_conversion_at_a_time,
    read_record,
    staged_save,
)
from lightning_strategies_deepspeed import checkpoint as checkpoints
from lightning_strategies_deepspeed import compatibility
from lightning_strategies_deepspeed.checkpoint_layout import CONVERTED_SUFFIX

SOURCE = "source.json"


def needs_conversion(
    location: checkpoints.CheckpointLocation,
    layout: compatibility.SavedLayout,
    world_size: int,
    restores_optimizer: bool,
) -> bool:
    """A ZeRO checkpoint whose partitioned optimizer state was saved by another number of processes."""
    partitioned = bool(layout.optimizer_ranks)
    return restores_optimizer and partitioned and not location.universal and layout.world_size != world_size


def converted_path(location: checkpoints.CheckpointLocation) -> Path:
    """Where the universal form of the checkpoint at ``location`` is kept."""
    return location.directory / f"{location.tag}{CONVERTED_SUFFIX}"


@contextmanager
def resume_anywhere(
    strategy: Any,
    location: checkpoints.CheckpointLocation,
    layout: compatibility.SavedLayout,
    restores_optimizer: bool,
    weights_only: bool | None,
) -> Iterator[tuple[checkpoints.CheckpointLocation, compatibility.SavedLayout]]:
    """The checkpoint to load on this run's processes, within the block: ``location`` itself, or its universal form
    where it was saved by another number of processes: kept inside the checkpoint folder (made on rank 0 if not made
    yet), or, where that folder cannot be written here, made beside it for this load alone (core's
    ``form_for_the_load``). Called on every rank together."""
    world_size = int(strategy.world_size)
    if not needs_conversion(location, layout, world_size, restores_optimizer):
        yield location, layout
        return
    saved = (
        f"The DeepSpeed checkpoint {location.directory} was saved {layout.describe()}; this run has {world_size} "
        f"process{'es' if world_size != 1 else ''}, so it is converted to DeepSpeed's universal layout before loading"
    )
    by_hand = f"`python -m lightning_strategies_deepspeed.convert --universal {location.directory} OUTPUT`"

    def failure(error: Exception) -> str:
        if isinstance(error, _Unconvertible):
            return f"{saved}, which cannot be done: {error} What was saved is unchanged."
        if isinstance(error, CheckpointError):  # a file refused as damaged, or by weights_only
            return f"{saved}, and one of its files is refused: {error}"
        if isinstance(error, OSError) and cannot_write(error):
            return (
                f"{saved}, kept inside the checkpoint folder or else written beside it for this resume, and neither "
                f"can be written here ({error}). What was saved is unchanged. Convert it by hand into a folder you "
                f"can write ({by_hand}) and resume from OUTPUT."
            )
        return (
            f"{saved}, and the conversion failed. What was saved is unchanged. Resume on {layout.world_size} "
            f"processes, or copy the checkpoint again from where it was written.\n{type(error).__name__}: {error}"
        )

    # The other ranks wait meanwhile, so their cores are free: one conversion worker per process of this machine.
    workers = min(os.cpu_count() or 1, max(1, int(getattr(strategy, "num_processes", 1) or 1)))

    def make(scratch: Callable[[Path], Path]) -> tuple[Path, str]:
        kept = converted_path(location)
        try:
            return kept, _convert_once(location, kept, workers, weights_only)
        except _ReadOnly as error:
            rank_zero_info(f"{location.directory} cannot be written here ({error}): its universal form goes beside it.")
        target = scratch(location.directory.parent) / "universal"
        _write_universal(location, target, workers)
        return target, (
            f"Converted {location.directory} (saved {layout.describe()}) to DeepSpeed's universal layout at {target}, "
            f"for this resume alone: it is removed after the load. To keep one, convert by hand ({by_hand})."
        )

    what = f"the universal form of {location.directory}"
    with form_for_the_load(strategy, make, failure, "latest_universal", what, by_hand) as (target, done):
        rank_zero_info(done)
        yield checkpoints.inspect(target, weights_only)


def _convert_once(
    location: checkpoints.CheckpointLocation, target: Path, workers: int, weights_only: bool | None
) -> str:
    """Write (or find) the universal form at ``target``; return the line saying which. Jobs resuming the same
    checkpoint at once take turns (``one_conversion_at_a_time``): the second finds the first's form and reuses it."""
    source = _fingerprint(location)
    processes = "process" if source["world_size"] == 1 else "processes"
    reused = (
        f"Resuming {location.directory} (saved on {source['world_size']} {processes}) from its universal form "
        f"{target}, converted on an earlier resume."
    )
    if _made_from(target, source):
        return reused
    checkpoints.check_model_states_load(location, weights_only)
    _check_adam_state(location, source["world_size"])
    try:
        with one_conversion_at_a_time(target):
            if _made_from(target, source):  # by the job this one waited for
                return reused
            _write_universal(location, target, workers, source)
    except OSError as error:
        if cannot_write(error):
            raise _ReadOnly(str(error)) from error
        raise
    return (
        f"Converted {location.directory} (saved on {source['world_size']} {processes}) to DeepSpeed's universal "
        f"layout at {target}, to resume on another number of processes; later resumes reuse it."
    )


def _write_universal(
    location: checkpoints.CheckpointLocation, target: Path, workers: int, source: dict[str, Any] | None = None
) -> None:
    """Write the universal form of ``location`` at ``target``, whole or not at all, with the ``source`` it is made
    from recorded inside where it is kept for later resumes."""
    universal_tag = location.tag + checkpoints.UNIVERSAL_SUFFIX
    with staged_save(target) as staged:
        staged.mkdir(parents=True)
        checkpoints.write_universal(location.tag_folder, staged / universal_tag, location.directory, workers)
        staged.joinpath("latest_universal").write_text(universal_tag)
        if source is not None:
            staged.joinpath(SOURCE).write_text(json.dumps(source, indent=1, sort_keys=True))


def _made_from(target: Path, source: dict[str, Any]) -> bool:
    """Whether ``target`` is the universal form of ``source``: False where there is none or it is stale (converted
    again); refused where the folder there was not written by this conversion."""
    if not target.exists():
        return False
    recorded = read_record(target / SOURCE)
    if recorded is None:
        raise _Unconvertible(
            f"{target} exists and was not written by this conversion; it is left as it is. Move it away to "
            "resume here, or convert by hand into another folder."
        )
    return recorded == source


class _Unconvertible(CheckpointError):
    """A checkpoint DeepSpeed's universal conversion cannot take, known before running it."""


class _ReadOnly(Exception):
    """The checkpoint folder cannot be written here, so its universal form cannot be kept inside it."""


def _check_adam_state(location: checkpoints.CheckpointLocation, saved_world_size: int) -> None:
    """DeepSpeed's ds_to_universal reads ``exp_avg`` and ``exp_avg_sq`` of every parameter group and fails with a
    KeyError on any other optimizer's state (SGD, Adagrad, ...): refused here with what to do instead."""
    optimizer_file = checkpoints.optimizer_file_without_adam_state(location)
    if optimizer_file is not None:
        raise _Unconvertible(
            "DeepSpeed's universal layout carries Adam-type optimizer state only (exp_avg and exp_avg_sq of every "
            f"parameter), and the optimizer saved in {optimizer_file.name} keeps neither (SGD, Adagrad, ...). Resume "
            f"on {saved_world_size} process{'es' if saved_world_size != 1 else ''} (devices x num_nodes), or start "
            f"from its weights alone: `python -m lightning_strategies_deepspeed.convert {location.directory} "
            "weights.ckpt`, then DeepSpeedStrategy(load_full_weights=True) with ckpt_path='weights.ckpt' (the "
            "optimizer starts afresh)."
        )


def _fingerprint(location: checkpoints.CheckpointLocation) -> dict[str, Any]:
    """What identifies the saved files: a checkpoint saved again under the same name is converted again."""
    files = files_fingerprint(location.tag_folder)
    layout = compatibility.SavedLayout.of(location.tag_folder, {})
    return {"tag": location.tag, "files": files, "world_size": max(len(layout.optimizer_ranks), 1)}
