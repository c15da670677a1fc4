"""Loading errors that say what happened: a missing, truncated or unreadable checkpoint file becomes a
``CheckpointError`` naming the problem and the fix, before a backend's loader fails somewhere deep inside."""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

from lightning_strategies.checkpoints.formats import earlier_checkpoint_advice
from lightning_strategies.errors import CheckpointError

# The legacy torch.save format begins with a protocol-2 pickle of torch's magic number.
_LEGACY_TORCH_SAVE_START = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"

# Lightning passes trainer.fit/validate/test/predict's weights_only only to strategies that load the checkpoint
# before setup; for those that load after (this project's fsdp, deepspeed and colossalai strategies) it drops it, so
# the Trainer's argument cannot be the advice. Allowing the classes works with the Trainer and Fabric alike.
_TRUST = (
    "If you trust the file, allow its classes with torch.serialization.add_safe_globals (or inside "
    "torch.serialization.safe_globals) before loading, or pass weights_only=False to fabric.load. The Trainer's "
    "weights_only=False does not reach strategies that load checkpoints after setup (this project's fsdp, "
    "deepspeed and colossalai strategies): Lightning drops it."
)


def load_file(
    path: str | os.PathLike[str], weights_only: bool | None = None, trust: str = _TRUST, **options: Any
) -> Any:
    """``torch.load`` with errors that name the file, what is wrong with it and what to do.

    ``trust`` says how the caller's user reads a trusted file with pickled objects (a command-line
    tool has its own flag for it).
    """
    path = Path(path)
    check_file(path)
    if _is_legacy_torch_save(path):
        options.pop("mmap", None)  # torch maps only the zip format
    try:
        return torch.load(path, weights_only=weights_only, **options)
    except Exception as error:
        if weights_only is not False and "weights_only" in str(error):
            raise CheckpointError(
                f"{path} holds objects that loading with weights_only=True refuses (it runs no pickled code): "
                f"{str(error).splitlines()[0]} {trust}"
            ) from error
        raise CheckpointError(f"{path} could not be read ({error}). {earlier_checkpoint_advice(path)}") from error


def load_weights_file(path: str | os.PathLike[str], weights_only: bool | None = None) -> Any:
    """A checkpoint file read into host memory whatever device saved its tensors (mapped, not copied, where torch
    can): the ``read_weights`` of core's single-file format."""
    return load_file(path, weights_only, map_location="cpu", mmap=True)


def check_file(path: Path, verify: bool = True) -> None:
    """Refuse a missing, empty, truncated or damaged ``torch.save`` file before reading it.

    ``verify`` checks each record against its checksum, which reads the whole file once: right for the process
    about to read it (the load then reads from the page cache), wasted in a sweep over files that other processes
    read, which passes False and leaves the checksums to each file's reader.
    """
    if not path.exists():
        raise CheckpointError(f"No checkpoint file at {path}. Check the path, or list the folder for the ones there.")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"The checkpoint file {path} is empty (0 bytes). {earlier_checkpoint_advice(path)}")
    zipped = zipfile.is_zipfile(path)
    if not zipped and not _is_legacy_torch_save(path):
        with open(path, "rb") as handle:
            start = handle.read(8)
        # What was found, not a guess at how: a cut-short save and a file that never was one look alike.
        raise CheckpointError(
            f"The checkpoint file {path} is truncated or corrupted: it holds {size:,} bytes starting with "
            f"{start!r}, without the table of contents that ends a torch.save file. {earlier_checkpoint_advice(path)}"
        )
    if verify and zipped:
        _check_records(path)


def _check_records(path: Path) -> None:
    """Refuse a file whose records do not match the CRC-32 that torch.save wrote beside each one.

    torch.load never checks them, so a changed byte in a tensor loads as a wrong weight and one in the pickle
    as an error that looks like a weights_only refusal. Reading the file once more costs little next to
    loading it (about 5 GB/s from the page cache on one core), and the load then reads from that cache.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as error:
        damaged = f"? ({error})"
    if damaged is not None:
        raise CheckpointError(
            f"The checkpoint file {path} is damaged: its record {damaged} does not match the checksum torch.save "
            "wrote with it, so bytes changed after the save (a faulty disk, copy or download). "
            f"{earlier_checkpoint_advice(path)}"
        )


def _is_legacy_torch_save(path: Path) -> bool:
    # torch.save's pre-zip format (DeepSpeed writes it with checkpoint_serialization=False) has no
    # table of contents to check; torch.load reads it or fails, and load_file words that failure.
    with open(path, "rb") as handle:
        return handle.read(len(_LEGACY_TORCH_SAVE_START)) == _LEGACY_TORCH_SAVE_START
