"""The sharded checkpoint folder (``meta.pt`` + ``model/`` + ``optimizer/``): written through ColossalAI's
checkpoint IO, and checked before ColossalAI reads it.

``model/`` and ``optimizer/`` are ColossalAI's index format: one ``*.index.json`` naming the shard
files (and, for the optimizer, the param-groups file). Shards hold whole tensors gathered on rank 0,
so the folder loads on any number of GPUs. ``meta.pt`` is Lightning's checkpoint without the model
and optimizer states, which the shards hold.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import (
    check_file,
    foreign_checkpoint_error,
    identify,
    is_local,
    keyed_by_name,
    load_file,
    staged_save,
)
from lightning_strategies_colossalai.checkpoint_state import fp32_chunk_transfers

SHARDED_MARKER = "colossalai_sharded_checkpoint"
META_FILE = "meta.pt"
MODEL_FOLDER = "model"
OPTIMIZER_FOLDER = "optimizer"

_RESUME_EARLIER = "Resume from an earlier checkpoint, or save this one again."
_READS = "its sharded checkpoint folders (meta.pt + model/) and full checkpoint files"


def sharded_meta(checkpoint: dict[str, Any], optimizer_count: int) -> dict[str, Any]:
    """What ``meta.pt`` holds: Lightning's checkpoint without the states written as shards.

    What this adds is plain values, so ``meta.pt`` loads with ``weights_only=True`` whenever Lightning's
    own part of the checkpoint does (user hyperparameters of arbitrary classes may not).
    """
    meta = {key: value for key, value in checkpoint.items() if key not in ("state_dict", "optimizer_states")}
    meta[SHARDED_MARKER] = True
    if "optimizer_states" in checkpoint:
        # Lightning's checkpoint connector requires this key to restore optimizers; the states
        # themselves are in the optimizer/ shard files, loaded by the strategy's load_checkpoint.
        meta["optimizer_states"] = [{SHARDED_MARKER: "optimizer"} for _ in range(optimizer_count)]
    return meta


def check_sharded_target(filepath: Any, storage_options: Any) -> None:
    """Refuse what the shard files cannot be written to, before any rank starts gathering."""
    if storage_options is not None:
        raise TypeError(
            "ColossalAIStrategy(state_dict_type='sharded') writes its own shard files and takes no "
            "storage_options; use state_dict_type='full' with a CheckpointIO plugin instead."
        )
    if not is_local(filepath):
        raise ValueError(
            f"ColossalAIStrategy(state_dict_type='sharded') writes shard files on a local or mounted file "
            f"system, not to {str(filepath)!r}. Save to a local path, or use state_dict_type='full' with a "
            "CheckpointIO plugin for remote storage."
        )


def save_sharded(
    gemini_io: Any,
    gemini_model: Any,
    optimizers: list[Any],
    checkpoint: dict[str, Any],
    folder: Path,
    shard_size_mb: int,
    write_meta: bool,
) -> None:
    """Every rank takes part in gathering the shards; rank 0 (``write_meta``) writes them and the meta file."""
    with fp32_chunk_transfers(gemini_model):
        gemini_io.save_model(gemini_model, str(folder / MODEL_FOLDER), shard=True, size_per_shard=shard_size_mb)
    # A weights-only checkpoint (ModelCheckpoint(save_weights_only=True)) has no optimizer_states.
    if "optimizer_states" in checkpoint:
        for optimizer in optimizers:
            gemini_io.save_optimizer(
                getattr(optimizer, "_optimizer", optimizer),
                str(folder / OPTIMIZER_FOLDER),
                shard=True,
                size_per_shard=shard_size_mb,
            )
    if write_meta:
        torch.save(sharded_meta(checkpoint, len(optimizers)), folder / META_FILE)


def load_sharded(gemini_io: Any, gemini_model: Any, optimizers: list[Any], folder: Path) -> None:
    """Load the model shards, and the optimizer shards into ``optimizers`` (none: weights only)."""
    with fp32_chunk_transfers(gemini_model):
        gemini_io.load_model(gemini_model, str(folder / MODEL_FOLDER), strict=True)
    for optimizer in optimizers:
        gemini_io.load_optimizer(getattr(optimizer, "_optimizer", optimizer), str(folder / OPTIMIZER_FOLDER))


def check_sharded_checkpoint(path: Path, with_optimizer: bool, weights_only: bool | None) -> dict[str, Any]:
    """Check a sharded checkpoint folder before ColossalAI reads it and return its ``meta.pt``.

    Another strategy's folder, or a folder of no known format, is refused with what it is and how to
    convert it; an incomplete or damaged one with what is missing.
    """
    # checkpoint_layout describes this package's layout from this module's file names, so it is imported here.
    from lightning_strategies_colossalai.checkpoint_layout import COLOSSALAI

    found = identify(path)
    if found not in (None, COLOSSALAI):
        raise foreign_checkpoint_error(path, "ColossalAIStrategy", here=_READS)
    if not is_sharded_folder(path):
        raise CheckpointError(
            f"{path} is a folder but not a ColossalAIStrategy sharded checkpoint (it needs {META_FILE} and "
            f"{MODEL_FOLDER}/). Point ckpt_path at a checkpoint written with state_dict_type='sharded', or at "
            "a full checkpoint file."
        )
    check_sharded_folder(path, with_optimizer)
    # Read first: a weights_only refusal stops the load before any shard is read.
    return read_sharded_meta(path, weights_only)


def read_weights(path: str | os.PathLike[str], weights_only: bool | None = None) -> dict[str, Any]:
    """A sharded checkpoint folder's model weights, whole, with Lightning's entries from ``meta.pt`` beside them (one
    process, no GPU: the shards hold whole tensors): the ``read_weights`` of the ColossalAI format."""
    folder = Path(path)
    check_sharded_folder(folder, with_optimizer=False)
    return _weights_with_meta(folder, read_sharded_meta(folder, weights_only), weights_only)


def to_full_checkpoint(
    path: str | os.PathLike[str], destination: str | os.PathLike[str], weights_only: bool | None = None
) -> Path:
    """The ``to_full_checkpoint`` of the ColossalAI format: one Lightning checkpoint file at ``destination`` with the
    whole weights, the optimizer states (by parameter name where every weight is a trained parameter, as the other
    strategies key them; else by position, as ColossalAI and torch save them), schedulers and loop state."""
    folder = Path(path)
    meta = read_sharded_meta(folder, weights_only)
    with_optimizer = "optimizer_states" in meta
    check_sharded_folder(folder, with_optimizer)
    checkpoint = _weights_with_meta(folder, meta, weights_only)
    if with_optimizer:
        # One optimizer: the colossalai strategies refuse more (refusals.check_optimizers).
        optimizer = _read_optimizer(folder / OPTIMIZER_FOLDER, weights_only)
        checkpoint["optimizer_states"] = [keyed_by_name(optimizer, checkpoint["state_dict"]) or optimizer]
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with staged_save(destination) as staged:
        torch.save(checkpoint, staged)
    return destination


def _weights_with_meta(folder: Path, meta: dict[str, Any], weights_only: bool | None) -> dict[str, Any]:
    """``meta.pt``'s entries with the model shards' weights, for a checked folder."""
    # The result holds the weights itself: without the marker, a strategy loading it as one file would skip them as
    # loaded from shards, and the optimizer placeholders stand for shards it does not carry.
    rest = {key: value for key, value in meta.items() if key not in (SHARDED_MARKER, "optimizer_states")}
    model_folder = folder / MODEL_FOLDER
    return {**rest, "state_dict": _read_shards(model_folder, _index(model_folder), weights_only)}


def _index(folder: Path) -> dict[str, Any]:
    """The folder's ColossalAI index (its one ``*.index.json``, which ``check_sharded_folder`` checked)."""
    return json.loads(next(folder.glob("*.index.json")).read_text())


def _read_shards(folder: Path, index: dict[str, Any], weights_only: bool | None) -> dict[Any, Any]:
    """The entries of the shard files ``index`` names, in its order (the model's, as written)."""
    entries: dict[Any, Any] = {}
    for name in dict.fromkeys(index["weight_map"].values()):
        entries.update(load_file(folder / name, weights_only=weights_only, map_location="cpu"))
    order = {str(key): position for position, key in enumerate(index["weight_map"])}
    return dict(sorted(entries.items(), key=lambda item: order.get(str(item[0]), len(order))))


def _read_optimizer(folder: Path, weights_only: bool | None) -> dict[str, Any]:
    """The optimizer state of the ``optimizer/`` shards in torch's ``Optimizer.state_dict()`` layout: the states by
    position (the shards' keys) and the param groups (their own file, named in the index)."""
    index = _index(folder)
    groups = load_file(folder / index["metadata"]["param_groups"], weights_only=weights_only, map_location="cpu")
    state = {int(key): value for key, value in _read_shards(folder, index, weights_only).items()}
    return {"state": state, "param_groups": groups}


def is_sharded_folder(path: Path) -> bool:
    """A folder meant as a sharded checkpoint: either part is there (completeness is checked apart)."""
    return path.is_dir() and ((path / META_FILE).exists() or (path / MODEL_FOLDER).exists())


def check_sharded_folder(folder: Path, with_optimizer: bool) -> None:
    """Refuse an incomplete or damaged sharded checkpoint before ColossalAI fails inside its loader."""
    if not (folder / MODEL_FOLDER).is_dir():
        raise CheckpointError(
            f"The sharded checkpoint {folder} has no {MODEL_FOLDER}/ folder with the model shards: it is incomplete "
            f"(files were removed, or it was copied in part). {_RESUME_EARLIER}"
        )
    if not (folder / META_FILE).is_file():
        raise CheckpointError(
            f"The sharded checkpoint {folder} has no {META_FILE} (Lightning's training state): it is incomplete "
            f"(files were removed, or it was copied in part). {_RESUME_EARLIER}"
        )
    check_file(folder / META_FILE)
    _check_shards(folder / MODEL_FOLDER, "model")
    if not with_optimizer:
        return
    if not (folder / OPTIMIZER_FOLDER).is_dir():
        raise CheckpointError(
            f"The sharded checkpoint {folder} has no {OPTIMIZER_FOLDER}/ folder to resume from: it was saved "
            "weights-only. Resume from a checkpoint saved with the optimizer state, or load only the "
            "weights (for example trainer.validate(model, ckpt_path=...))."
        )
    _check_shards(folder / OPTIMIZER_FOLDER, "optimizer")


def read_sharded_meta(folder: Path, weights_only: bool | None) -> dict[str, Any]:
    """Load ``meta.pt`` with ``weights_only`` as Lightning passed it (None: torch's default)."""
    meta = load_file(folder / META_FILE, weights_only=weights_only, map_location="cpu")
    if not isinstance(meta, dict) or not meta.get(SHARDED_MARKER):
        raise CheckpointError(
            f"{folder / META_FILE} was not written by ColossalAIStrategy (it lacks the {SHARDED_MARKER!r} "
            "entry), so the folder is no ColossalAI sharded checkpoint. Point ckpt_path at one saved with "
            "state_dict_type='sharded', or at a full checkpoint file."
        )
    return meta


def _check_shards(folder: Path, what: str) -> None:
    """The folder's one ``*.index.json`` parses and every file it names is a whole ``torch.save`` file."""
    indexes = sorted(folder.glob("*.index.json"))
    if len(indexes) != 1:
        found = ", ".join(index.name for index in indexes) or "none"
        raise CheckpointError(
            f"{folder} should hold one ColossalAI index file (*.index.json) listing the {what} shards; found "
            f"{found}. The checkpoint is incomplete or two were mixed. {_RESUME_EARLIER}"
        )
    try:
        index = json.loads(indexes[0].read_text())
        files = set(index["weight_map"].values())
        group_file = index.get("metadata", {}).get("param_groups")
    except (ValueError, KeyError, AttributeError, TypeError) as error:
        raise CheckpointError(
            f"The index file {indexes[0]} is damaged ({error!r}): the {what} shards cannot be found. {_RESUME_EARLIER}"
        ) from error
    if group_file:
        files.add(group_file)
    for name in sorted(files):
        check_file(folder / name)
