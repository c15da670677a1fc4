"""Check a checkpoint on disk before DCP or torch.load reads it, and read DCP's files no more trustingly
than ``weights_only`` allows.

DCP's own reader unpickles ``.metadata`` and every non-tensor item without restriction and meets a
truncated shard only half way through a load, as an error wrapped in tracebacks of every rank. Here
``.metadata`` is read first, with an unpickler that builds only DCP's index types (unless
``weights_only=False``); every shard file it lists is checked for presence and length (the index
records each item's offset and size); and the index is handed to DCP so that it never unpickles the
file itself.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
import sys
import warnings
from pathlib import Path, PurePath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from typing_extensions import override

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import (
    FILE,
    check_file,
    earlier_checkpoint_advice,
    foreign_checkpoint_error,
    identify,
)
from lightning_strategies_fsdp.checkpoint_layout import DCP
from lightning_strategies_fsdp.checksums import SHARD_SUFFIX, mismatches, saved_checksums
from lightning_strategies_fsdp.options import STRATEGY

METADATA_FILE = "meta.pt"
DCP_METADATA_FILE = ".metadata"
# DCP's file writer stores every item as a torch.save record: a zip archive, which starts with this.
_TORCH_SAVE_HEADER = b"PK\x03\x04"


def _damaged(folder: Path) -> str:
    return (
        "This package publishes a checkpoint only once every rank has written it, so its files changed afterwards "
        "(a partial copy or download, a full disk) or came from an unfinished save elsewhere. "
        f"{earlier_checkpoint_advice(folder)}"
    )


# The Trainer's weights_only never reaches this strategy (Lightning drops it for strategies that load after setup),
# and DCP's index is read by our own unpickler, which torch's safe globals do not widen: what reads a trusted
# folder is Fabric's weights_only=False, or the converter's, whose full file the Trainer then loads.
_TRUST_HINT = (
    "Only if you trust where the checkpoint came from: read it with fabric.load(..., weights_only=False), or, for "
    "the Trainer (Lightning drops trainer.fit/validate/test/predict's weights_only for strategies that load "
    "checkpoints after setup), convert it with `python -m lightning_strategies_fsdp.convert SOURCE DESTINATION "
    "--no-weights-only` and load the full checkpoint file it writes."
)

# The types DCP builds its index from (dataclasses and enums in these modules), and the torch and
# pathlib values they hold. Anything else in a .metadata file was not written by DCP.
_DCP_INDEX_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_INDEX_VALUES = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
}
_PATH_TYPES = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}


def _not_a_checkpoint(path: Path) -> str:
    """Lightning's words for a path that is neither a sharded checkpoint folder nor a file, which ours begin with."""
    return (
        f"The path {str(path)!r} does not point to a valid checkpoint. Make sure the path points to either a "
        "directory with FSDP checkpoint shards, or a single file with a full checkpoint."
    )


def check_checkpoint_path(path: Path) -> None:
    """Refuse a path holding neither a sharded (DCP folder) nor a full (single file) checkpoint of this package."""
    found = identify(path)
    if found is not None and found.key not in (DCP.key, FILE.key):  # another installed package's layout
        here = "a sharded checkpoint folder (DCP) or a full checkpoint file"
        raise CheckpointError(f"{_not_a_checkpoint(path)} {foreign_checkpoint_error(path, STRATEGY, here)}")
    if not path.exists():
        raise CheckpointError(f"{_not_a_checkpoint(path)} No checkpoint at that path. Check the path.")
    if path.is_file() or (path / DCP_METADATA_FILE).is_file():
        return
    if any(path.glob(f"*{SHARD_SUFFIX}")) or (path / METADATA_FILE).is_file():
        raise CheckpointError(
            f"The sharded checkpoint {path} has no {DCP_METADATA_FILE}, DCP's index of its shard files, so it is "
            f"incomplete. {_damaged(path)}"
        )
    raise CheckpointError(
        f"{_not_a_checkpoint(path)} It is a folder but no checkpoint: a sharded FSDP2 checkpoint holds DCP's "
        f"{DCP_METADATA_FILE}, *{SHARD_SUFFIX} shards and {METADATA_FILE}."
    )


def is_sharded_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / DCP_METADATA_FILE).is_file()


def checked_sharded_metadata(folder: Path, weights_only: bool | None) -> Metadata:
    """DCP's index of ``folder``, once every item it lists is where it says, whole."""
    metadata = _read_index(folder / DCP_METADATA_FILE, weights_only)
    items_by_file: dict[str, list[tuple[str, Any]]] = {}
    for index, location in metadata.storage_data.items():
        relative = PurePath(location.relative_path)
        if relative.is_absolute() or ".." in relative.parts:
            raise CheckpointError(
                f"The sharded checkpoint {folder} lists a shard outside its folder ({location.relative_path}); "
                f"DCP never writes that. {_TRUST_HINT}"
            )
        items_by_file.setdefault(location.relative_path, []).append((index.fqn, location))
    for name, items in sorted(items_by_file.items()):
        _check_shard(folder, name, items)
    if (folder / METADATA_FILE).exists():
        check_file(folder / METADATA_FILE)
    return metadata


def _check_shard(folder: Path, name: str, items: list[tuple[str, Any]]) -> None:
    shard = folder / name
    if not shard.is_file():
        raise CheckpointError(
            f"The sharded checkpoint {folder} lacks {name}, which its {DCP_METADATA_FILE} lists. {_damaged(folder)}"
        )
    size = shard.stat().st_size
    needed = max(location.offset + location.length for _, location in items)
    if size < needed:
        raise CheckpointError(
            f"{shard} is truncated: {size} bytes, where the checkpoint's {DCP_METADATA_FILE} records {needed}. "
            f"{_damaged(folder)}"
        )
    with open(shard, "rb") as file:
        for fqn, location in items:
            if getattr(location, "transform_descriptors", None):  # the field is newer than torch 2.6
                continue  # compressed or otherwise transformed by a DCP extension: no torch.save header to see
            file.seek(location.offset)
            if file.read(len(_TORCH_SAVE_HEADER)) != _TORCH_SAVE_HEADER:
                raise CheckpointError(
                    f"{shard} is corrupted: {fqn} at byte {location.offset} is not the torch.save record its "
                    f"{DCP_METADATA_FILE} records there. {_damaged(folder)}"
                )


def stored_keys(metadata: Metadata) -> set[str]:
    """Top-level keys of the state a sharded checkpoint holds (model and optimizers)."""
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


def load_sharded_state(
    state: dict[str, Any],
    folder: Path,
    metadata: Metadata,
    weights_only: bool | None,
    allow_partial_load: bool = False,
    no_dist: bool = False,
) -> None:
    """``dcp.load`` of ``state`` in place from a folder checked by ``checked_sharded_metadata``."""
    try:
        dcp.load(
            state,
            storage_reader=_CheckedReader(folder, metadata),
            planner=_CheckedLoadPlanner(weights_only, allow_partial_load=allow_partial_load),
            no_dist=no_dist,
        )
    except CheckpointException as error:  # a BaseException: every rank's failures, with tracebacks
        rank, (failure, _) = min(error.failures.items())
        if isinstance(failure, CheckpointError):
            raise failure from None
        raise CheckpointError(
            f"Reading the sharded checkpoint {folder} failed on rank {rank}: {type(failure).__name__}: "
            f"{_first_line(failure)}. If the model or optimizer differs from the one saved, build the same one "
            "(strict=False loads the matching part of the model); if the files changed after saving, copy the whole "
            "folder again or resume from an earlier checkpoint."
        ) from None


class _CheckedReader(FileSystemReader):
    """DCP's file reader, given the index already read and checked instead of unpickling it again."""

    def __init__(self, folder: Path, metadata: Metadata) -> None:
        super().__init__(folder)
        self._checked_metadata = metadata
        self._folder = folder
        self._checksums = saved_checksums(folder)
        if not self._checksums:
            rank_zero_warn(
                f"{folder} was saved without checksums of its shards (by Lightning's FSDPStrategy, by DCP directly, or "
                "before this package recorded them): its shards are checked for presence and length, not verified."
            )

    @override
    def read_data(self, plan: Any, planner: Any) -> Any:
        # Each rank verifies the shards its own part of the load reads; DCP gathers a failure to every rank.
        names = {self.storage_data[item.storage_index].relative_path for item in plan.items}
        unrecorded = sorted(names - self._checksums.keys()) if self._checksums else []
        if unrecorded:  # the others have checksums: this rank's record was lost or damaged after the save
            warnings.warn(
                f"{self._folder} has no recorded checksum for {', '.join(unrecorded)} (its .checksums-<rank>.json is "
                "missing or unreadable), though it has them for other shards: these are loaded unverified.",
                stacklevel=2,
            )
        for name, difference in mismatches(self._folder, names, self._checksums):
            raise CheckpointError(f"{self._folder / name} is damaged: {difference}. {_damaged(self._folder)}")
        return super().read_data(plan, planner)

    @override
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._checked_metadata.storage_meta is None:
            self._checked_metadata.storage_meta = StorageMeta()
        self._checked_metadata.storage_meta.load_id = self.load_id
        return self._checked_metadata


class _CheckedLoadPlanner(DefaultLoadPlanner):
    """DCP unpickles non-tensor items (optimizer hyperparameters) with weights_only=False; this planner
    first reads each one as ``weights_only`` says and refuses it where that fails."""

    def __init__(self, weights_only: bool | None, allow_partial_load: bool = False) -> None:
        super().__init__(allow_partial_load=allow_partial_load)
        self.weights_only = weights_only

    @override
    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        if self.weights_only is not False:
            try:
                torch.load(value, weights_only=self.weights_only)  # None: torch's default, True on torch>=2.6
            except pickle.UnpicklingError as error:
                raise CheckpointError(
                    f"The checkpoint item {read_item.dest_index.fqn} holds objects that loading with "
                    f"weights_only=True refuses: {_first_line(error)} {_TRUST_HINT}"
                ) from None
            value.seek(0)
        super().load_bytes(read_item, value)


def _read_index(path: Path, weights_only: bool | None) -> Metadata:
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}, DCP's index of the checkpoint, is empty. {_damaged(path.parent)}")
    try:
        with open(path, "rb") as file:
            # weights_only=False: DCP's own way, unrestricted; the user trusts this checkpoint.
            metadata = pickle.load(file) if weights_only is False else _IndexUnpickler(file).load()
    except _RefusedGlobal as refused:
        raise CheckpointError(
            f"{path} refers to {refused}, which is none of the types DCP writes into its index, so it was not "
            f"written by DCP as it stands and reading it could run code. {_TRUST_HINT}"
        ) from None
    except Exception as error:
        raise CheckpointError(
            f"{path}, DCP's index of the checkpoint, cannot be read ({type(error).__name__}: {_first_line(error)}). "
            f"{_damaged(path.parent)}"
        ) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"{path} holds a {type(metadata).__name__}, not DCP's index of a checkpoint. {_damaged(path.parent)}"
        )
    return metadata


class _RefusedGlobal(pickle.UnpicklingError):
    pass


class _IndexUnpickler(pickle.Unpickler):
    """Unpickles DCP's index and refuses any other type or function (weights_only for ``.metadata``)."""

    @override
    def find_class(self, module: str, name: str) -> Any:
        if _is_index_type(module, name):
            return super().find_class(module, name)
        raise _RefusedGlobal(f"{module}.{name}")


def _is_index_type(module: str, name: str) -> bool:
    if "." in name:
        return False  # a dotted name reaches attributes of attributes (os.system from a module that imports os)
    if (module, name) in _INDEX_VALUES:
        return True
    if module == "torch":
        return isinstance(getattr(torch, name, None), torch.dtype)
    if module == "pathlib" or module.startswith("pathlib."):
        return name in _PATH_TYPES
    if module in _DCP_INDEX_MODULES:
        value = getattr(sys.modules.get(module), name, None)
        is_data_type = isinstance(value, type) and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum))
        return is_data_type and value.__module__ == module
    return False


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]
