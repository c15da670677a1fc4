"""Checkpoints of FSDP2 models: sharded (a DCP folder) or full (one ``torch.save`` file), and both ways
between them.

A sharded checkpoint is a folder: DCP writes each process's shards of the model and optimizer
states, and rank 0 writes everything else (loop state, callbacks, hyperparameters) to
``meta.pt``. DCP records global tensor layouts, so a sharded checkpoint loads onto any number
of processes. A full checkpoint is one file any plain PyTorch or Lightning program can read.
Loading tells the two apart by what is on disk, whatever the strategy's ``state_dict_type``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

METADATA_FILE = "meta.pt"
DCP_METADATA_FILE = ".metadata"
# The Trainer's checkpoint keeps optimizer states in a list; DCP keys must be strings.
TRAINER_OPTIMIZERS = "optimizer_states"


class CheckpointFormatError(ValueError):
    """A path that holds neither a sharded (DCP folder) nor a full (single file) checkpoint."""


def is_sharded_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / DCP_METADATA_FILE).is_file()


def is_full_checkpoint(path: Path) -> bool:
    return path.is_file()


def check_checkpoint_path(path: Path) -> None:
    if is_sharded_checkpoint(path) or is_full_checkpoint(path):
        return
    if path.is_dir():
        raise CheckpointFormatError(
            f"{path} is a folder without DCP's {DCP_METADATA_FILE} file, so it is not a sharded checkpoint "
            "(or its writing was interrupted). Point to a complete sharded checkpoint folder or a full "
            "checkpoint file."
        )
    raise FileNotFoundError(f"No checkpoint at {path}: expected a sharded checkpoint folder or a full checkpoint file.")


def model_state(model: nn.Module, full: bool) -> dict[str, Any]:
    """Sharded: each process's DTensor shards. Full: the whole state on rank 0 (CPU), empty elsewhere."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=full, cpu_offload=full))


def optimizer_state(model: nn.Module, optimizer: Optimizer, full: bool) -> dict[str, Any]:
    """Optimizer state keyed by parameter names, so it loads onto any sharding."""
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=full, cpu_offload=full))


def save_sharded(path: Path, tensors: dict[str, Any], metadata: dict[str, Any], rank: int) -> None:
    """Write a sharded checkpoint folder; every process calls this."""
    if path.is_file():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    dcp.save(tensors, checkpoint_id=path)
    if rank == 0:
        torch.save(metadata, path / METADATA_FILE)


def save_full(path: Path, checkpoint: dict[str, Any], rank: int) -> None:
    """Write a full checkpoint file from rank 0, replacing a sharded folder of the same name."""
    if rank != 0:
        return
    if is_sharded_checkpoint(path):
        shutil.rmtree(path)
    elif path.is_dir():
        raise IsADirectoryError(f"Cannot write a full checkpoint to {path}: it is an existing folder.")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)


def stored_keys(path: Path) -> set[str]:
    """Top-level keys of the tensors stored in a sharded checkpoint."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


def load_into(
    path: Path,
    model: nn.Module,
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    strict: bool = True,
    weights_only: bool | None = None,
) -> dict[str, Any]:
    """Load ``model`` and ``optimizers`` (by key) from either kind of checkpoint; return the rest."""
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
    available = stored_keys(path)
    if model_key not in available:
        raise CheckpointFormatError(
            f"The sharded checkpoint {path} has no model state under {model_key!r} (it has: {sorted(available)})."
        )
    state = {model_key: model_state(model, full=False)}
    dcp.load(state, checkpoint_id=path, planner=dcp.DefaultLoadPlanner(allow_partial_load=not strict))
    set_model_state_dict(model, state[model_key], options=StateDictOptions(strict=strict))
    for key, optimizer in optimizers.items():
        if key not in available:
            continue  # saved without optimizer states (save_weights_only): keep the fresh optimizer
        optimizer_sd = {key: optimizer_state(model, optimizer, full=False)}
        dcp.load(optimizer_sd, checkpoint_id=path)
        set_optimizer_state_dict(model, optimizer, optimizer_sd[key])
    metadata_path = path / METADATA_FILE
    if not metadata_path.is_file():
        return {}
    return torch.load(metadata_path, weights_only=bool(weights_only))


def _load_full(
    path: Path,
    model: nn.Module,
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    strict: bool,
    weights_only: bool | None,
) -> dict[str, Any]:
    checkpoint = split_trainer_optimizers(
        torch.load(path, mmap=True, map_location="cpu", weights_only=bool(weights_only))
    )
    if model_key not in checkpoint:
        raise CheckpointFormatError(
            f"The checkpoint file {path} has no model state under {model_key!r} (it has: {sorted(checkpoint)})."
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


def sharded_to_full(source: str | os.PathLike, destination: str | os.PathLike) -> Path:
    """Write the full checkpoint file equivalent to a sharded checkpoint folder (one process, no GPU)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    source, destination = Path(source), Path(destination)
    if not is_sharded_checkpoint(source):
        check_checkpoint_path(source)
        raise CheckpointFormatError(f"{source} is a full checkpoint already; nothing to convert.")
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination.parent) as scratch:
        tensors_file = Path(scratch) / "tensors.pt"
        dcp_to_torch_save(source, tensors_file)
        checkpoint = torch.load(tensors_file, weights_only=False)
    metadata_path = source / METADATA_FILE
    if metadata_path.is_file():
        checkpoint.update(torch.load(metadata_path, weights_only=False))
    if "state_dict" in checkpoint:  # a Trainer checkpoint: keep Lightning's layout
        checkpoint = join_trainer_optimizers(checkpoint)
    torch.save(checkpoint, destination)
    return destination


def full_to_sharded(source: str | os.PathLike, destination: str | os.PathLike) -> Path:
    """Write a sharded checkpoint folder from a full checkpoint file (one process, no GPU)."""
    source, destination = Path(source), Path(destination)
    check_checkpoint_path(source)
    if is_sharded_checkpoint(source):
        raise CheckpointFormatError(f"{source} is a sharded checkpoint already; nothing to convert.")
    checkpoint = split_trainer_optimizers(torch.load(source, map_location="cpu", weights_only=False))
    tensors = {key: value for key, value in checkpoint.items() if _is_sharded_state(value)}
    metadata = {key: value for key, value in checkpoint.items() if key not in tensors}
    destination.mkdir(parents=True, exist_ok=True)
    dcp.save(tensors, checkpoint_id=destination, no_dist=True)
    torch.save(metadata, destination / METADATA_FILE)
    return destination
