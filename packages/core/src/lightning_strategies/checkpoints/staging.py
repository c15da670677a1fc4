"""Checkpoints that survive a crash mid-save.

A strategy writes into a staging path beside the target and publishes it once every
rank has written, with one atomic rename (or, for a folder replacing a folder, an atomic
exchange of the two). A process killed at any moment of a save therefore leaves the previous
checkpoint whole under its name, and nothing half-written carries a name that Lightning's
``ckpt_path="last"`` would pick: the staging folder is hidden and has no ``.ckpt`` suffix.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STAGING_FOLDER = ".lightning-strategies-staging"
_PREVIOUS_SUFFIX = ".previous"
_TRASH_SUFFIX = ".removing"


def staging_path(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    return path.parent / STAGING_FOLDER / path.name


def _alone() -> None:
    """The barrier of a save that one process writes alone."""


# How long rank 0 waits, after a failed save, for the other ranks to leave it before removing what they staged.
_FAILED_WAIT_SECONDS = 30.0


@contextmanager
def staged_save(
    path: str | os.PathLike[str], is_global_zero: bool = True, barrier: Callable[[], None] = _alone
) -> Iterator[Any]:
    """Yield the path every rank writes to (a ``Path``, or a remote URL as given); publish it as
    ``path`` once all ranks are done.

    Every rank enters and leaves together (``barrier`` is the strategy's). If the body raises,
    nothing is published and the previous checkpoint stays as it was; once every rank has left the save
    (each counts itself out in the process group's store), rank 0 removes the staged files and every
    folder the save created, so the folder is left as the save found it. Where another rank does not fail
    with it (its save went on, or it died), rank 0 stops waiting after a while and leaves what is staged for
    the next save to clear, rather than pulling a folder from under a rank still writing. A
    remote URL is yielded as it is: object stores publish an object whole when it is closed, and
    have no rename.
    """
    if not is_local(path):
        yield path
        return
    target = Path(path)
    staged = staging_path(target)
    created: list[Path] = []
    if is_global_zero:
        recover(target)
        _remove_tree(staged)  # left by a save that was killed
        created = _make_folders(staged.parent)
    barrier()
    try:
        yield staged
    except BaseException:
        others_done = every_rank_left("save") if barrier is not _alone else True
        if is_global_zero and others_done:
            # The error the user sees stays the save's own: what cannot be removed now, the next save clears.
            with contextlib.suppress(OSError):
                _remove_tree(staged)
                for folder in reversed(created):
                    _remove_if_empty(folder)
        raise
    barrier()
    if is_global_zero:
        publish(staged, target)
        _remove_if_empty(staged.parent)
    barrier()


_failures: dict[str, int] = {}


def every_rank_left(block: str) -> bool:
    """Count this rank out of the ``block`` (a save, a load) that just failed on it; on rank 0, whether every rank
    did within a while (30 s), so that what the block wrote can be removed without pulling it from under a rank
    still using it. True without a process group.

    A barrier cannot be used here: a rank whose block went on would meet it in place of the one after the block
    (for a save, rank 0 would publish a checkpoint missing that rank's files). Each failed block has its own key,
    since every rank counts the blocks that failed on it alike when they fail together.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return True
    from torch.distributed.distributed_c10d import _get_default_store

    _failures[block] = _failures.get(block, 0) + 1
    key = f"lightning_strategies/failed_{block}/{_failures[block]}"
    store = _get_default_store()
    left = store.add(key, 1)
    if dist.get_rank() != 0:
        return False
    deadline = time.monotonic() + _FAILED_WAIT_SECONDS
    while left < dist.get_world_size() and time.monotonic() < deadline:
        time.sleep(0.05)
        left = store.add(key, 0)
    return left >= dist.get_world_size()


def cannot_write(error: OSError) -> bool:
    """Whether ``error`` says the place cannot be written here (a read-only mount, another user's folder)."""
    return isinstance(error, PermissionError) or error.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def is_local(path: str | os.PathLike[str]) -> bool:
    """A path on this machine's file systems (not ``s3://``, ``gs://``, ``file://``...), where staging works."""
    return "://" not in str(path)


def publish(staged: Path, target: Path) -> None:
    """Move a completely written checkpoint from ``staged`` to ``target`` in one step."""
    _sync_tree(staged)
    if target.exists() and target.is_dir() != staged.is_dir():
        # A file replacing a folder (or the reverse), e.g. after switching state_dict_type:
        # no single rename can do it, so keep the old one aside until the new one is in place.
        _swap_with_previous(staged, target)
    elif target.is_dir() and _exchange(staged, target):
        _remove_tree(staged)  # now holds the previous checkpoint
    elif target.is_dir():
        _swap_with_previous(staged, target)
    else:
        os.replace(staged, target)  # atomic for files, and for a folder where nothing was
    _sync_folder(target.parent)


def recover(path: str | os.PathLike[str]) -> None:
    """Put back a checkpoint left aside by a save killed between its two renames."""
    if not is_local(path):
        return
    target = Path(path)
    previous = _previous_path(target)
    if previous.exists() and not target.exists():
        os.replace(previous, target)


def recover_before_load(
    path: str | os.PathLike[str], is_global_zero: bool = True, barrier: Callable[[], None] = lambda: None
) -> None:
    """``recover`` for a strategy's load: rank 0 alone renames (ranks racing would collide), the
    others wait for it."""
    if is_global_zero:
        recover(path)
    barrier()


def remove(path: str | os.PathLike[str]) -> None:
    """Delete a checkpoint so that a kill half way never leaves a partial one under its name."""
    if not is_local(path):
        raise ValueError(f"remove() deletes local checkpoints; delete {path} through its file system (fsspec).")
    target = Path(path)
    if not target.exists():
        return
    trash = staging_path(target).with_name(target.name + _TRASH_SUFFIX)
    trash.parent.mkdir(parents=True, exist_ok=True)
    _remove_tree(trash)
    os.replace(target, trash)
    _remove_tree(trash)
    _remove_if_empty(trash.parent)


def _previous_path(target: Path) -> Path:
    return staging_path(target).with_name(target.name + _PREVIOUS_SUFFIX)


def _swap_with_previous(staged: Path, target: Path) -> None:
    previous = _previous_path(target)
    _remove_tree(previous)
    os.replace(target, previous)
    os.replace(staged, target)  # a kill between these two renames is undone by recover()
    _remove_tree(previous)


_RENAME_EXCHANGE = 2
_AT_CURRENT_FOLDER = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    result = renameat2(
        _AT_CURRENT_FOLDER, os.fsencode(first), _AT_CURRENT_FOLDER, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False  # a file system without exchange (NFS, some FUSE mounts)
    raise OSError(code, os.strerror(code), str(first))


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the ones created, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    missing.reverse()
    for each in missing:
        each.mkdir(exist_ok=True)
    return missing


def _remove_if_empty(folder: Path) -> None:
    # Not left behind in the user's checkpoint folder; a folder still holding something stays.
    with contextlib.suppress(OSError):
        folder.rmdir()


def _sync_tree(path: Path) -> None:
    """Flush what was written to disk: a preempted node must not come back with empty files."""
    files = [path] if path.is_file() else [item for item in path.rglob("*") if item.is_file()]
    for file in files:
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    if path.is_dir():
        for folder in [path, *[item for item in path.rglob("*") if item.is_dir()]]:
            _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
