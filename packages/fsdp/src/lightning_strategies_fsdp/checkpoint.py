"""Checkpoints of FSDP2 models: sharded (a DCP folder) or full (one ``torch.save`` file), and both ways
between them.

A sharded checkpoint is a folder: DCP writes each process's shards of the model and optimizer
states, and rank 0 writes everything else (loop state, callbacks, hyperparameters) to
``meta.pt``. DCP records global tensor layouts, so a sharded checkpoint loads onto any number
of processes. A full checkpoint is one file any plain PyTorch or Lightning program can read.
Loading tells the two apart by what is on disk, whatever the strategy's ``state_dict_type``.

Every write goes to a staging path that core's ``staged_save`` publishes under the checkpoint's
name once complete, and every read is checked first (``validation``), so a crash mid-save never
leaves a partial checkpoint under a name, and a damaged one is refused with what to do.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from lightning_strategies.checkpoints import load_file, staged_save
from lightning_strategies.errors import CheckpointError
from lightning_strategies_fsdp.validation import (
    METADATA_FILE,
    check_checkpoint_path,
    checked_sharded_metadata,
    is_sharded_checkpoint,
    load_sharded_state,
    stored_keys,
)

# The Trainer's checkpoint keeps optimizer states in a list; DCP keys must be strings.
TRAINER_OPTIMIZERS = "optimizer_states"


def model_state(model: nn.Module, full: bool) -> dict[str, Any]:
    """Sharded: each process's DTensor shards. Full: the whole state on rank 0 (CPU), empty elsewhere."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=full, cpu_offload=full))


def optimizer_state(model: nn.Module, optimizer: Optimizer, full: bool) -> dict[str, Any]:
    """Optimizer state keyed by parameter names, so it loads onto any sharding."""
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=full, cpu_offload=full))


@contextmanager
def staged_checkpoint(
    path: Path, is_global_zero: bool = True, barrier: Callable[[], None] = lambda: None
) -> Iterator[Path]:
    """Core's ``staged_save``, refusing first to replace a folder that holds something other than a checkpoint."""
    if path.is_dir() and not is_sharded_checkpoint(path) and any(path.iterdir()):
        # Publishing swaps out whatever is at the path; a user's folder must not be lost to a mistyped name.
        raise IsADirectoryError(
            f"Cannot save a checkpoint to {path}: it is a folder that holds no checkpoint, and saving replaces what "
            "is at the path. Choose another path, or remove the folder first."
        )
    with staged_save(path, is_global_zero, barrier) as staged:
        yield staged


def save_sharded(
    path: Path, tensors: dict[str, Any], metadata: dict[str, Any], rank: int, no_dist: bool = False
) -> None:
    """Write a sharded checkpoint folder at the staging ``path``; every process calls this."""
    path.mkdir(parents=True, exist_ok=True)
    dcp.save(tensors, checkpoint_id=path, no_dist=no_dist)
    if rank == 0:
        torch.save(metadata, path / METADATA_FILE)


def save_full(path: Path, checkpoint: dict[str, Any], rank: int) -> None:
    """Write a full checkpoint file at the staging ``path`` from rank 0."""
    if rank == 0:
        torch.save(checkpoint, path)


def load_into(
    path: Path,
    model: nn.Module,
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    strict: bool = True,
    weights_only: bool | None = None,
) -> dict[str, Any]:
    """Load ``model`` and ``optimizers`` (by key) from either kind of checkpoint; return the rest.

    ``weights_only`` is Lightning's: None leaves torch's default (True since torch 2.6), which
    Lightning's own loop state, callbacks and plain hyperparameters pass.
    """
    check_checkpoint_path(path)
    if is_sharded_checkpoint(path):
        return _load_sharded(path, model, model_key, optimizers, strict, weights_only)
    return _load_full(path, model, model_key, optimizers, strict, weights_only)


def _load_sharded(
    path: Path,
    model: nn.Module,
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    strict: bool,
    weights_only: bool | None,
) -> dict[str, Any]:
    metadata = checked_sharded_metadata(path, weights_only)
    available = stored_keys(metadata)
    if model_key not in available:
        raise CheckpointError(
            f"The sharded checkpoint {path} has no model state under {model_key!r} (it has: {sorted(available)}). "
            "Point to a checkpoint of this model, or (Fabric) load with the model under the key it was saved with."
        )
    # meta.pt first: a refusal (weights_only) must come before the model is half loaded.
    metadata_path = path / METADATA_FILE
    rest = load_file(metadata_path, weights_only) if metadata_path.is_file() else {}
    state = {model_key: model_state(model, full=False)}
    load_sharded_state(state, path, metadata, weights_only, allow_partial_load=not strict)
    set_model_state_dict(model, state[model_key], options=StateDictOptions(strict=strict))
    for key, optimizer in optimizers.items():
        if key not in available:
            continue  # saved without optimizer states (save_weights_only): keep the fresh optimizer
        optimizer_sd = {key: optimizer_state(model, optimizer, full=False)}
        load_sharded_state(optimizer_sd, path, metadata, weights_only)
        set_optimizer_state_dict(model, optimizer, optimizer_sd[key])
    return rest


def _load_full(
    path: Path,
    model: nn.Module,
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    strict: bool,
    weights_only: bool | None,
) -> dict[str, Any]:
    checkpoint = split_trainer_optimizers(load_file(path, weights_only, mmap=True, map_location="cpu"))
    if model_key not in checkpoint:
        raise CheckpointError(
            f"The checkpoint file {path} has no model state under {model_key!r} (it has: {sorted(checkpoint)}). "
            "Point to a checkpoint of this model, or (Fabric) load with the model under the key it was saved with."
        )
    # Every process maps the same file; each copies out only its own shards.
    full = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, checkpoint.pop(model_key), options=full)
    for key, optimizer in optimizers.items():
        if key not in checkpoint:
            continue
        state = name_keyed_optimizer_state(checkpoint.pop(key), model, optimizer)
        set_optimizer_state_dict(model, optimizer, state, options=full)
    return checkpoint


def split_trainer_optimizers(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Lightning's ``optimizer_states`` list as ``optimizer_0``, ``optimizer_1``... keys."""
    states = checkpoint.pop(TRAINER_OPTIMIZERS, None)
    for index, state in enumerate(states or []):
        checkpoint[f"optimizer_{index}"] = state
    return checkpoint


def join_trainer_optimizers(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``split_trainer_optimizers``, for files Lightning's own tools read."""
    keys = sorted((key for key in checkpoint if _is_optimizer_key(key)), key=lambda key: int(key.split("_")[1]))
    if keys:
        checkpoint[TRAINER_OPTIMIZERS] = [checkpoint.pop(key) for key in keys]
    return checkpoint


def _is_optimizer_key(key: str) -> bool:
    prefix, _, index = key.partition("_")
    return prefix == "optimizer" and index.isdigit()


def name_keyed_optimizer_state(state: dict[str, Any], model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """Optimizer state saved by a plain (unsharded) run is keyed by parameter position; DCP wants names."""
    if not state.get("state") and not state.get("param_groups"):
        return state
    keys = list(state.get("state", {})) + [key for group in state["param_groups"] for key in group["params"]]
    if not keys or not all(isinstance(key, int) for key in keys):
        return state
    names_by_param = {param: name for name, param in model.named_parameters()}
    ordered = [names_by_param[param] for group in optimizer.param_groups for param in group["params"]]
    return {
        "state": {ordered[index]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [ordered[index] for index in group["params"]]} for group in state["param_groups"]
        ],
    }


def _is_sharded_state(value: Any) -> bool:
    """A model state (names to tensors) or an optimizer state: what DCP stores in a sharded checkpoint."""
    if not isinstance(value, Mapping) or not value:
        return False
    if set(value) == {"state", "param_groups"}:
        return True
    return all(isinstance(item, torch.Tensor) for item in value.values())


def sharded_to_full(
    source: str | os.PathLike, destination: str | os.PathLike, weights_only: bool | None = None
) -> Path:
    """Write the full checkpoint file equivalent to a sharded checkpoint folder (one process, no GPU)."""
    source, destination = Path(source), Path(destination)
    check_checkpoint_path(source)
    if not is_sharded_checkpoint(source):
        raise CheckpointError(f"{source} is a full checkpoint already; nothing to convert.")
    metadata = checked_sharded_metadata(source, weights_only)
    metadata_path = source / METADATA_FILE
    rest = load_file(metadata_path, weights_only) if metadata_path.is_file() else {}
    checkpoint = {**_whole_state(source, metadata, weights_only), **rest}
    if "state_dict" in checkpoint:  # a Trainer checkpoint: keep Lightning's layout
        checkpoint = join_trainer_optimizers(checkpoint)
    with staged_checkpoint(destination) as staged:
        torch.save(checkpoint, staged)
    return destination


def full_to_sharded(
    source: str | os.PathLike, destination: str | os.PathLike, weights_only: bool | None = None
) -> Path:
    """Write a sharded checkpoint folder from a full checkpoint file (one process, no GPU)."""
    source, destination = Path(source), Path(destination)
    check_checkpoint_path(source)
    if is_sharded_checkpoint(source):
        raise CheckpointError(f"{source} is a sharded checkpoint already; nothing to convert.")
    checkpoint = split_trainer_optimizers(load_file(source, weights_only, map_location="cpu"))
    tensors = {key: value for key, value in checkpoint.items() if _is_sharded_state(value)}
    metadata = {key: value for key, value in checkpoint.items() if key not in tensors}
    with staged_checkpoint(destination) as staged, _in_one_process():
        save_sharded(staged, tensors, metadata, rank=0, no_dist=True)
    return destination


def _whole_state(folder: Path, metadata: Metadata, weights_only: bool | None) -> dict[str, Any]:
    """Every tensor and value of a sharded checkpoint, unsharded, in the nesting it was saved with."""
    state: dict[str, Any] = {}
    for key, item in metadata.state_dict_metadata.items():
        # Tensors are read into tensors of their global size; None holds the place of other values.
        value = torch.empty(item.size, dtype=item.properties.dtype) if isinstance(item, TensorStorageMetadata) else None
        where = (metadata.planner_data or {}).get(key, (key,))  # DCP flattened nested keys on save
        _set_nested(state, where, value)
    with _in_one_process():
        load_sharded_state(state, folder, metadata, weights_only, no_dist=True)
    return state


@contextmanager
def _in_one_process() -> Iterator[None]:
    """DCP warns on every single-process save or load, even when asked for one (no_dist=True)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")
        yield


def _set_nested(root: dict[str, Any], where: tuple[str | int, ...], value: Any) -> None:
    """Put ``value`` at ``where``, a path of dict keys and list positions, creating containers on the way."""
    container: Any = root
    for step, following in itertools.pairwise(where):
        if _get(container, step) is None:
            _put(container, step, [] if isinstance(following, int) else {})
        container = _get(container, step)
    _put(container, where[-1], value)


def _get(container: Any, step: str | int) -> Any:
    if isinstance(container, list):
        return container[step] if step < len(container) else None
    return container.get(step)


def _put(container: Any, step: str | int, value: Any) -> None:
    if isinstance(container, list):
        container.extend([None] * (step + 1 - len(container)))
    container[step] = value
