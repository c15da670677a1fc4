"""Checkpoints written through Lightning's CheckpointIO: staged so a crash never leaves half a file under
the name, and checked before they are read (other strategies' checkpoints named by
``formats.identify``, with the fix).

For strategies that keep Lightning's one-file checkpoints (colossalai with state_dict_type="full",
xla). CheckpointIO classes are matched by name: Lightning defines each in ``lightning`` and again
in ``pytorch_lightning`` / ``lightning_fabric``, and this module imports neither.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_info

from lightning_strategies.checkpoints.formats import FILE, CheckpointFormat, foreign_checkpoint_error, identify
from lightning_strategies.checkpoints.loading import check_file
from lightning_strategies.checkpoints.rank_zero import check_seen, on_rank_zero
from lightning_strategies.checkpoints.scratch import files_fingerprint, one_conversion_at_a_time, read_record
from lightning_strategies.checkpoints.staging import is_local, remove, staged_save
from lightning_strategies.errors import CheckpointError

ONE_FILE = "one checkpoint file (what trainer.save_checkpoint, ModelCheckpoint or fabric.save write)"


_TORCH_SAVE_CHECKPOINT_IOS = ("TorchCheckpointIO", "XLACheckpointIO")


def writes_in_background(checkpoint_io: Any) -> bool:
    """Whether ``save_checkpoint`` returns before the file is written, so nothing can publish it after.

    Lightning's AsyncCheckpointIO does (its writes finish in a thread); Fabric has none.
    """
    return any(cls.__name__ == "AsyncCheckpointIO" for cls in type(checkpoint_io).__mro__)


@contextlib.contextmanager
def staged_checkpoint_io_save(
    path: Any, checkpoint_io: Any, is_global_zero: bool, barrier: Callable[[], None]
) -> Iterator[Any]:
    """Yield where every rank writes the checkpoint ``path``; it appears under ``path`` once all are done.

    The yielded path is core's staging path (published by ``staged_save`` with one rename), or
    ``path`` itself where no rename can publish it: a remote URL (core passes it through: object
    stores publish an object whole when it is closed), or a CheckpointIO writing in the background.
    Every rank enters and leaves together.
    """
    if writes_in_background(checkpoint_io):
        yield path
        return
    with staged_save(path, is_global_zero, barrier) as staged:
        yield staged


def remove_checkpoint_path(path: Any, checkpoint_io: Any) -> None:
    """Delete a file or folder checkpoint so that no kill leaves part of it under its name."""
    if is_local(path):
        remove(path)
    else:
        checkpoint_io.remove_checkpoint(path)


def reads_torch_save_files(checkpoint_io: Any) -> bool:
    """Whether the CheckpointIO reads what one ``torch.save`` wrote: Lightning's own do, also behind
    AsyncCheckpointIO; a plugin of another kind (another format, remote storage) checks its own files."""
    if writes_in_background(checkpoint_io):
        checkpoint_io = checkpoint_io.checkpoint_io
    return type(checkpoint_io).__name__ in _TORCH_SAVE_CHECKPOINT_IOS


def check_checkpoint_file(path: Any, checkpoint_io: Any, strategy: str) -> None:
    """Refuse what cannot be a one-file checkpoint before the CheckpointIO reads it: another strategy's
    checkpoint (named by core's ``identify``, with how to convert it), or a missing, empty or truncated file."""
    if not is_local(path) or not reads_torch_save_files(checkpoint_io):
        return
    path = Path(path)
    if not path.is_dir():
        check_file(path)
    if identify(path) is not FILE:
        raise foreign_checkpoint_error(path, strategy, here=ONE_FILE)


# What strategies keep inside another strategy's folder, converted from it on the first resume that needs it: its
# one-file form with the record of the folder's files it came from (``scratch.files_fingerprint``), and forms in a
# package's own layout (``kept_form``), each a folder holding its own record. None of them is part of the checkpoint.
ONE_FILE_NAME = "full.ckpt"
ONE_FILE_SOURCE = "full.ckpt.source.json"
KEPT_FORM_PREFIX = "converted-"


def kept_form(folder: str | Path, layout: str) -> Path:
    """Where a package keeps the folder ``folder`` (another strategy's checkpoint) converted to its layout
    ``layout`` (its ``CheckpointFormat.key``) for reuse by later resumes."""
    return Path(folder) / f"{KEPT_FORM_PREFIX}{layout}"


def source_record(folder: str | Path, **built_with: Any) -> dict[str, Any]:
    """What a form kept inside another strategy's ``folder`` is converted from, to record beside it: the folder's own
    files (``files_fingerprint``; what is kept inside left out) and ``built_with``, whatever else the conversion
    took (the keys of a Fabric state). A kept form whose record differs is converted again."""
    found = identify(folder)
    derived = found.derived if found is not None else ()
    files = files_fingerprint(
        Path(folder), leave_out=(ONE_FILE_NAME, ONE_FILE_SOURCE, f"{KEPT_FORM_PREFIX}*", *derived)
    )
    return {**built_with, "files": files} if built_with else files


def convert_once(
    made: Path, record: Path, source: dict[str, Any], convert: Callable[[], Any], output: Path | None = None
) -> bool:
    """Run ``convert`` (which writes its ``output``, ``made`` itself or a folder holding ``made``, whole or not at all)
    unless ``made`` is there with the ``record`` of the ``source`` it was converted from; return whether it was
    reused. The record is written after the output: a conversion killed before leaves none, so the next converts
    again. Jobs converting the same source at once take turns (``one_conversion_at_a_time`` on ``output``); one that
    finds the output current writes nothing."""

    def current() -> bool:
        return made.exists() and read_record(record) == source

    if current():
        return True
    with one_conversion_at_a_time(output or made):
        if current():  # made by the job this one waited for
            return True
        convert()
        with staged_save(record) as staged:
            staged.write_text(json.dumps(source, indent=1, sort_keys=True))
    return False


def one_file_for(path: Any, strategy: Any, weights_only: bool | None = None, native: Collection[str] = ()) -> Any:
    """What a strategy that reads one checkpoint file (Lightning's ddp) loads for ``path``: ``path`` itself, or, for
    another strategy's folder whose package converts it to one file without dropping anything (its format's
    ``to_full_checkpoint``: FSDP2's DCP folders, DeepSpeed's ZeRO folders), that file, written by global rank 0
    into the folder as ``full.ckpt`` and reused by later resumes while the folder's files are those it was converted
    from (``full.ckpt.source.json`` records their sizes and times).
    Called on every rank together, with a strategy that has ``is_global_zero``, ``broadcast`` and
    ``reduce_boolean_decision``: rank 0 decides and converts, the others follow its answer (``on_rank_zero``), and
    all check together that each sees the file (``check_seen``).
    Folders of the layouts whose keys are in ``native`` (those the strategy reads itself: "dcp" for the fsdp
    strategies) and folders no package converts are returned as they are."""
    if not is_local(path):
        return path
    name = type(strategy).__name__
    target = on_rank_zero(strategy, lambda: _one_file_on_rank_zero(Path(path), name, weights_only, native))
    if target is None:
        return path
    by_hand = f"`lightning-strategies convert {path} full.ckpt --to full`"
    check_seen(strategy, target, f"the one-file form of {path}", by_hand)
    return target


def one_file_here(path: str | Path, strategy: str, weights_only: bool | None = None) -> Path:
    """What ``one_file_for`` reads for ``path``, made (or found current) by this process alone: for work global rank
    0 does for every rank (``on_rank_zero``) that reads the one file itself. ``strategy`` names the reader in the
    refusal of a folder that cannot be converted."""
    return Path(_one_file_on_rank_zero(Path(path), strategy, weights_only, ()) or path)


def _one_file_on_rank_zero(path: Path, strategy: str, weights_only: bool | None, native: Collection[str]) -> str | None:
    """The one-file form of ``path`` where it is a folder to convert (None: load ``path`` itself)."""
    if not path.is_dir():
        return None
    found = identify(path)
    if found is None or not found.to_full_checkpoint or found.key in native:
        return None
    target = path / ONE_FILE_NAME
    try:
        reused = _write_one_file(path, found, target, weights_only)
    except Exception as error:
        raise CheckpointError(
            f"{path} is {found.description}; {strategy} reads one checkpoint file, so it is converted to one at "
            f"{target} first, and that failed: {type(error).__name__}: {error} Resume it with {found.read_by}, or "
            f"convert it where you can write (`lightning-strategies convert {path} OUT.ckpt --to full`) and resume "
            "from OUT.ckpt."
        ) from error
    how = "converted on an earlier resume" if reused else "converted now, reused by later resumes"
    rank_zero_info(
        f"Resuming {path} ({found.description}) under {strategy} from its one-file form {target} ({how}; weights, "
        "optimizer states, schedulers and loop state carried). Delete it to reclaim the space."
    )
    return str(target)


def _write_one_file(path: Path, found: CheckpointFormat, target: Path, weights_only: bool | None) -> bool:
    """Convert ``path`` to one file at ``target`` unless the one there is of the folder's files as they are now;
    return whether it was reused."""
    module, _, function = found.to_full_checkpoint.partition(":")
    to_full_checkpoint = getattr(importlib.import_module(module), function)
    return convert_once(
        target, path / ONE_FILE_SOURCE, source_record(path), lambda: to_full_checkpoint(path, target, weights_only)
    )


def weights_only_keyword(weights_only: bool | None) -> dict[str, bool]:
    """``weights_only`` for Lightning's ``load_checkpoint``, passed only when set: Lightning 2.5.0's
    has no such parameter, and None means torch's default anyway."""
    return {} if weights_only is None else {"weights_only": weights_only}


def check_trainer_checkpoint(checkpoint: Any, path: Any) -> None:
    """Refuse a file that ``torch.load`` reads but that is no Lightning checkpoint (a bare state dict):
    Lightning would fail later with ``KeyError: 'state_dict'``."""
    if isinstance(checkpoint, dict) and "state_dict" in checkpoint:
        return
    keys = sorted(map(str, checkpoint))[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
    raise CheckpointError(
        f"{path} is not a Lightning checkpoint: it has no 'state_dict' entry (it holds {keys}). A plain model "
        "state dict loads with model.load_state_dict(torch.load(path)), then call the Trainer without ckpt_path."
    )
