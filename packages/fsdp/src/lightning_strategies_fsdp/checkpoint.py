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
import math
import os
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
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
from torch.distributed.fsdp import FSDPModule
from torch.optim import Optimizer
from typing_extensions import override

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import (
    adopted_param_groups,
    keyed_by_name,
    load_file,
    reads_torch_save_files,
    scratch_folder,
    staged_save,
    weights_only_keyword,
)
from lightning_strategies.checkpoints import staged_checkpoint_io_save as staged_checkpoint_io
from lightning_strategies.hugging_face import recorded_models
from lightning_strategies.planning import available_memory
from lightning_strategies_fsdp.checksums import summing_writer, write_checksums
from lightning_strategies_fsdp.options import STRATEGY
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
    refuse_replacing_folder(path)
    with staged_save(path, is_global_zero, barrier) as staged:
        yield staged


def refuse_replacing_folder(path: Path) -> None:
    if path.is_dir() and not is_sharded_checkpoint(path) and any(path.iterdir()):
        # Publishing swaps out whatever is at the path; a user's folder must not be lost to a mistyped name.
        raise IsADirectoryError(
            f"The checkpoint path exists and is a directory: {path}. It holds no checkpoint, and saving replaces what "
            "is at the path: choose another path, or remove the folder first."
        )


@contextmanager
def staged_full_checkpoint(
    path: Path, checkpoint_io: Any, is_global_zero: bool, barrier: Callable[[], None]
) -> Iterator[Path]:
    """Where a CheckpointIO writes a full checkpoint: staged as every save is, unless the CheckpointIO writes
    in the background (then nothing could publish the file once written, so it writes under the name)."""
    refuse_replacing_folder(path)
    with staged_checkpoint_io(path, checkpoint_io, is_global_zero, barrier) as staged:
        yield Path(staged)


def checkpoint_io_writer(checkpoint_io: Any, storage_options: Any = None) -> Callable[[dict[str, Any], Path], None]:
    """Full checkpoints are written by the strategy's CheckpointIO, as Lightning's are."""

    def write(checkpoint: dict[str, Any], path: Path) -> None:
        checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)

    return write


def checkpoint_io_reader(checkpoint_io: Any, weights_only: bool | None) -> Callable[[Path], dict[str, Any]] | None:
    """A user's CheckpointIO reads the full checkpoint files it wrote. Lightning's own (torch.save files) are read
    by ``load_into`` instead, checked first and memory-mapped: None."""
    if reads_torch_save_files(checkpoint_io):
        return None
    return lambda path: checkpoint_io.load_checkpoint(path, **weights_only_keyword(weights_only))


def warn_if_checkpoint_io_unused(checkpoint_io: Any) -> None:
    """Sharded checkpoints are DCP folders: a user's CheckpointIO has no part in them."""
    if checkpoint_io is not None and not reads_torch_save_files(checkpoint_io):
        warnings.warn(
            f"{STRATEGY}(state_dict_type='sharded') writes its checkpoint folders with torch.distributed.checkpoint; "
            f"the {type(checkpoint_io).__name__} plugin is used for state_dict_type='full' only. Pass "
            "state_dict_type='full' to save through it.",
            stacklevel=3,
        )


def save_sharded(
    path: Path, tensors: dict[str, Any], metadata: dict[str, Any], rank: int, no_dist: bool = False
) -> None:
    """Write a sharded checkpoint folder at the staging ``path``; every process calls this."""
    path.mkdir(parents=True, exist_ok=True)
    writer, sums = summing_writer(path)
    dcp.save(tensors, checkpoint_id=path, storage_writer=writer, no_dist=no_dist)
    write_checksums(path, rank, sums)
    if rank == 0:
        torch.save(metadata, path / METADATA_FILE)


def save_full(
    path: Path, checkpoint: dict[str, Any], rank: int, write: Callable[[dict[str, Any], Path], None] | None = None
) -> None:
    """Write a full checkpoint file at the staging ``path`` from rank 0, with ``write`` (a CheckpointIO's
    ``save_checkpoint``) or ``torch.save``."""
    if rank == 0:
        (write or torch.save)(checkpoint, path)


class OptimizerStatesError(CheckpointError, KeyError, RuntimeError):
    """The checkpoint holds no optimizer state for an optimizer being resumed, or states of another number of
    optimizers. Lightning's FSDPStrategy raises KeyError for the first and RuntimeError for the second; this is
    both, so existing ``except`` clauses still catch it."""

    @override
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def load_into(
    path: Path,
    model: nn.Module,
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    strict: bool = True,
    weights_only: bool | None = None,
    all_optimizers: bool = False,
    read_full: Callable[[Path], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Load ``model`` and ``optimizers`` (by key) from either kind of checkpoint; return the rest.

    ``weights_only`` is Lightning's: None leaves torch's default (True since torch 2.6), which
    Lightning's own loop state, callbacks and plain hyperparameters pass. Every optimizer given must
    have its state in the checkpoint; with ``all_optimizers`` (a Trainer resuming) the checkpoint must
    also hold no other optimizer states. ``read_full`` reads a full checkpoint file in place of
    ``torch.load`` (a user's CheckpointIO).
    """
    if read_full is None or path.is_dir():  # a user's CheckpointIO checks the files it reads itself
        check_checkpoint_path(path)
    if is_sharded_checkpoint(path):
        return _load_sharded(path, model, model_key, optimizers, strict, weights_only, all_optimizers)
    if read_full is not None:
        checkpoint = read_full(path)
    else:
        checkpoint = load_file(path, weights_only, mmap=True, map_location="cpu")
    return load_full_state(path, checkpoint, model, model_key, optimizers, strict, all_optimizers)


def check_states_present(
    kind: str,
    path: Path,
    saved: Collection[str],
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    all_optimizers: bool,
) -> None:
    """Refuse, before anything loads, a checkpoint (``kind``: "The checkpoint file", ...) at ``path`` that has no
    state for the model under ``model_key`` or none for the optimizers to resume."""
    check_optimizer_states(path, saved, optimizers, all_optimizers)
    if model_key not in saved:
        raise CheckpointError(
            f"{kind} {path} has no model state under {model_key!r} (it has: {sorted(saved)}). "
            "Point to a checkpoint of this model, or (Fabric) load with the model under the key it was saved with."
        )


def check_optimizer_states(
    path: Path, saved: Iterable[str], optimizers: Mapping[str, Optimizer], all_optimizers: bool
) -> None:
    """Refuse, before anything loads, to resume optimizers the checkpoint has no states for.

    Resuming with fresh optimizer states would restart momentum and step counts while reporting a resume.
    """
    saved = set(saved)
    missing = [key for key in optimizers if key not in saved]
    if all_optimizers:
        saved_count = len([key for key in saved if _is_optimizer_key(key)])
        if missing and not saved_count:
            raise OptimizerStatesError(
                f"The checkpoint {path} holds the model but no optimizer states (it was saved with "
                "save_weights_only=True or weights_only=True), so training cannot resume from it. Load only the "
                "weights instead (Model.load_from_checkpoint, or trainer.validate/test with ckpt_path), or resume "
                "from a checkpoint saved with optimizer states."
            )
        if saved_count != len(optimizers):
            raise OptimizerStatesError(
                f"You have configured {len(optimizers)} optimizers but the checkpoint contains {saved_count} "
                "optimizers to load. Please resume training with the same number of optimizers or edit the checkpoint "
                f"manually to remove states. The checkpoint is {path}: resume with the optimizers of the run that "
                "saved it (configure_optimizers), or load only the weights (Model.load_from_checkpoint)."
            )
    if missing:
        raise OptimizerStatesError(
            f"The checkpoint {path} has no optimizer state under {missing} (it has: {sorted(saved)}). Load with the "
            "optimizers under the keys they were saved with, or leave them out of the state to keep them fresh."
        )


def _load_sharded(
    path: Path,
    model: nn.Module,
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    strict: bool,
    weights_only: bool | None,
    all_optimizers: bool,
) -> dict[str, Any]:
    metadata = checked_sharded_metadata(path, weights_only)
    available = stored_keys(metadata)
    check_states_present("The sharded checkpoint", path, available, model_key, optimizers, all_optimizers)
    reshard(model)
    # meta.pt first: a refusal (weights_only) must come before the model is half loaded.
    metadata_path = path / METADATA_FILE
    rest = load_file(metadata_path, weights_only) if metadata_path.is_file() else {}
    state = {model_key: model_state(model, full=False)}
    load_sharded_state(state, path, metadata, weights_only, allow_partial_load=not strict)
    set_model_state_dict(model, state[model_key], options=StateDictOptions(strict=strict))
    for key, optimizer in optimizers.items():
        optimizer_sd = {key: optimizer_state(model, optimizer, full=False)}
        load_sharded_state(optimizer_sd, path, metadata, weights_only)
        set_optimizer_state_dict(model, optimizer, optimizer_sd[key])
    return rest


def load_full_state(
    path: Path,
    checkpoint: dict[str, Any],
    model: nn.Module,
    model_key: str,
    optimizers: Mapping[str, Optimizer],
    strict: bool = True,
    all_optimizers: bool = False,
) -> dict[str, Any]:
    """Load ``model`` and ``optimizers`` from the contents of a full checkpoint file; return the rest."""
    checkpoint = split_trainer_optimizers(checkpoint)
    check_states_present("The checkpoint file", path, checkpoint, model_key, optimizers, all_optimizers)
    reshard(model)
    # Every process maps the same file; each copies out only its own shards.
    full = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, checkpoint.pop(model_key), options=full)
    for key, optimizer in optimizers.items():
        load_full_optimizer_state(model, optimizer, checkpoint.pop(key))
    return checkpoint


def reshard(model: nn.Module) -> None:
    """Put every FSDP module's parameters back to their shards before a load writes into them.

    The root is sharded with reshard_after_forward=False, so after a forward that no backward follows (validate,
    test, predict) it holds its unsharded parameters as plain tensors. torch's set_model_state_dict reads the
    parameters it loads into from the module before the load hooks reshard it: it would then copy plain tensors
    into the DTensor shards ("aten.copy_.default got mixed torch.Tensor and DTensor") on the next ckpt_path load.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def load_full_optimizer_state(model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
    state = name_keyed_optimizer_state(with_state_entry(state), model, optimizer)
    # Another Adam-family optimizer's groups (ColossalAI's HybridAdam) hold keys torch's loader refuses.
    # torch's AdamW decays decoupled whether or not its groups say so (the key is torch 2.6's).
    held = {"decoupled_weight_decay": True} if isinstance(optimizer, torch.optim.AdamW) else None
    groups = adopted_param_groups(state.get("param_groups") or [], optimizer.param_groups, held_outside_groups=held)
    state = {**state, "param_groups": groups}
    # torch distributes a full optimizer state onto the shards on the device of the optimizer's own tensor
    # states. An optimizer that keeps none (plain SGD) gives it no device ("Expected device to be set"), and
    # has nothing to distribute either: its hyperparameters load as they are.
    full = _holds_parameter_tensors(state["state"])
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=full))


def with_state_entry(state: Any) -> Any:
    """DCP stores no empty containers, so a sharded optimizer state without per-parameter tensors comes back
    without its (empty) ``state`` entry, which torch then reads as a flattened state."""
    if isinstance(state, Mapping) and "param_groups" in state and "state" not in state:
        return {"state": {}, **state}
    return state


def _holds_parameter_tensors(state: Mapping[Any, Any]) -> bool:
    return any(
        isinstance(value, torch.Tensor) and value.dim() > 0
        for per_parameter in state.values()
        for value in per_parameter.values()
    )


def _positions_restored(state: Any) -> Any:
    """An optimizer state keyed by parameter position (torch's own, as ddp saves it) comes back from DCP with its
    ``state`` keys as strings ("0", "1", ...): DCP's paths hold dict keys as strings. torch's ``load_state_dict``
    matches them against the int positions of ``param_groups`` and would restore no state, silently; they are ints
    again here. A list (Lightning's ``optimizer_states``) has each of its states restored. States keyed by parameter
    name, and anything else, are returned as they are."""
    if isinstance(state, list):
        return [_positions_restored(item) for item in state]
    if not (isinstance(state, Mapping) and isinstance(state.get("state"), Mapping) and "param_groups" in state):
        return state
    positions = [key for group in state["param_groups"] for key in group.get("params", [])]
    if not positions or not all(isinstance(key, int) for key in positions):
        return state
    keys = state["state"].keys()
    if not all(isinstance(key, str) and key.isdigit() for key in keys):
        return state
    return {**state, "state": {int(key): value for key, value in state["state"].items()}}


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
    source: str | os.PathLike,
    destination: str | os.PathLike,
    weights_only: bool | None = None,
    low_memory: bool | None = None,
) -> Path:
    """Write the full checkpoint file equivalent to a sharded checkpoint folder (one process, no GPU).

    ``low_memory`` reads the shards into tensors mapped from scratch files beside ``destination`` (removed after)
    instead of host memory, so that host memory need not hold the model, at the cost of writing it once more; None
    chooses it where the folder is larger than half the host memory available."""
    source, destination = Path(source), Path(destination)
    check_checkpoint_path(source)
    if not is_sharded_checkpoint(source):
        raise CheckpointError(f"{source} is a full checkpoint already; nothing to convert.")
    metadata = checked_sharded_metadata(source, weights_only)
    metadata_path = source / METADATA_FILE
    rest = load_file(metadata_path, weights_only) if metadata_path.is_file() else {}
    with _scratch(source, destination, low_memory) as backing:
        whole = _whole_state(source, metadata, weights_only, backing=backing)
        checkpoint = {**{key: with_state_entry(value) for key, value in whole.items()}, **rest}
        if "state_dict" in checkpoint:  # a Trainer checkpoint: keep Lightning's layout
            checkpoint = join_trainer_optimizers(checkpoint)
        checkpoint = {key: _positions_restored(value) for key, value in checkpoint.items()}
        with staged_checkpoint(destination) as staged:
            torch.save(checkpoint, staged)
    return destination


@contextmanager
def _scratch(source: Path, destination: Path, low_memory: bool | None) -> Iterator[Path | None]:
    """A scratch folder beside ``destination`` for ``sharded_to_full``'s mapped tensors, or None (host memory)."""
    if low_memory is None:
        size = sum(path.stat().st_size for path in source.glob("*.distcp"))  # the shards, not a full.ckpt beside
        available = available_memory()
        low_memory = available is not None and size > available / 2
    if not low_memory:
        yield None
        return
    with scratch_folder(destination.parent) as folder:
        yield folder


def full_to_sharded(
    source: str | os.PathLike, destination: str | os.PathLike, weights_only: bool | None = None
) -> Path:
    """Write a sharded checkpoint folder from a full checkpoint file (one process, no GPU)."""
    source, destination = Path(source), Path(destination)
    check_checkpoint_path(source)
    if is_sharded_checkpoint(source):
        raise CheckpointError(f"{source} is a sharded checkpoint already; nothing to convert.")
    # Mapped, not read: DCP writes each tensor from the file's pages, so host memory need not hold the model.
    checkpoint = _keyed_by_name(load_file(source, weights_only, map_location="cpu", mmap=True))
    checkpoint = split_trainer_optimizers(checkpoint)
    tensors = {key: value for key, value in checkpoint.items() if _is_sharded_state(value)}
    metadata = {key: value for key, value in checkpoint.items() if key not in tensors}
    with staged_checkpoint(destination) as staged, _in_one_process():
        save_sharded(staged, tensors, metadata, rank=0, no_dist=True)
    return destination


def _keyed_by_name(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A Trainer file's optimizer states keyed by parameter name, as the fsdp strategies save and resume them, where
    the file's positions map onto its ``state_dict`` exactly (core's ``keyed_by_name``; ddp's files); else kept by
    position, which ddp resumes from the folder and the fsdp strategies do not."""
    states, weights = checkpoint.get(TRAINER_OPTIMIZERS), checkpoint.get("state_dict")
    if not isinstance(states, list) or not isinstance(weights, Mapping):
        return checkpoint
    named = [keyed_by_name(state, weights) if isinstance(state, Mapping) else None for state in states]
    return {**checkpoint, TRAINER_OPTIMIZERS: [new or old for new, old in zip(named, states, strict=True)]}


def read_weights(source: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
    """A sharded checkpoint folder's model weights, whole, with Lightning's entries beside them (one process, no
    GPU): the ``read_weights`` of the DCP format, which ``lightning_strategies.hugging_face.export`` reads."""
    source = Path(source)
    check_checkpoint_path(source)
    metadata = checked_sharded_metadata(source, weights_only)
    metadata_path = source / METADATA_FILE
    rest = load_file(metadata_path, weights_only) if metadata_path.is_file() else {}
    return {**_whole_state(source, metadata, weights_only, only=_model_entries(metadata, rest)), **rest}


def _model_entries(metadata: Metadata, rest: dict[str, Any]) -> set[str] | None:
    """The entries holding model weights: a Trainer's ``state_dict``, else the keys under which Fabric saved the
    recorded ``transformers`` models; None (every entry) for a Fabric checkpoint without a record."""
    saved = {where[0] for where in (metadata.planner_data or {}).values()} | set(metadata.state_dict_metadata)
    if "state_dict" in saved:
        return {"state_dict"}
    # A recorded name is the state key the model was saved under, then its path inside; the key may hold dots.
    recorded = {key for key in saved for name in recorded_models(rest) if name == key or name.startswith(f"{key}.")}
    return recorded or None


def _whole_state(
    folder: Path,
    metadata: Metadata,
    weights_only: bool | None,
    only: set[str] | None = None,
    backing: Path | None = None,
) -> dict[str, Any]:
    """Every tensor and value of a sharded checkpoint (or of its entries ``only``), unsharded, in the nesting it was
    saved with; the tensors in host memory, or mapped from files in the folder ``backing``."""
    state: dict[str, Any] = {}
    for index, (key, item) in enumerate(metadata.state_dict_metadata.items()):
        where = (metadata.planner_data or {}).get(key, (key,))  # DCP flattened nested keys on save
        if only is not None and where[0] not in only:
            continue
        # Tensors are read into tensors of their global size; None holds the place of other values.
        value = None
        if isinstance(item, TensorStorageMetadata):
            value = _whole_tensor(item, backing / str(index) if backing else None)
        _set_nested(state, where, value)
    with _in_one_process():
        load_sharded_state(state, folder, metadata, weights_only, no_dist=True)
    return state


def _whole_tensor(item: TensorStorageMetadata, backing: Path | None) -> torch.Tensor:
    """An empty tensor of ``item``'s global size, mapped from the file ``backing`` (created) where given: its pages
    are then the file's, which the kernel writes out and drops as memory runs short."""
    count = math.prod(item.size)
    if backing is None or not count:
        return torch.empty(item.size, dtype=item.properties.dtype)
    return torch.from_file(str(backing), shared=True, size=count, dtype=item.properties.dtype).view(item.size)


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
    if isinstance(container, list) and isinstance(step, int):
        return container[step] if step < len(container) else None
    return container.get(step)


def _put(container: Any, step: str | int, value: Any) -> None:
    if isinstance(container, list) and isinstance(step, int):
        container.extend([None] * (step + 1 - len(container)))
    container[step] = value
