"""What conversions leave beside a checkpoint: their scratch folders, the record that tells their output stale, and
the lock that makes jobs converting one checkpoint take turns.

A conversion may write as much as the model into a scratch folder (DeepSpeed's universal layout, mapped tensors).
Its name carries the process that made it, so that the next conversion in the same folder removes one whose process
is gone (killed mid-way, nothing removed it) instead of leaving it to fill the disk.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn

if sys.platform != "win32":
    import fcntl

# Every working folder of this project begins with it (staging of saves, scratch folders): never part of a checkpoint.
WORKING_PREFIX = ".lightning-strategies-"
SCRATCH_PREFIX = f"{WORKING_PREFIX}scratch-"


@contextmanager
def scratch_folder(beside: str | os.PathLike[str]) -> Iterator[Path]:
    """A hidden folder in ``beside`` for a conversion's intermediate files, removed afterwards (``new_scratch``)."""
    folder = new_scratch(beside)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def new_scratch(beside: str | os.PathLike[str]) -> Path:
    """A new hidden folder in ``beside`` named after this process, for the caller to remove; scratch folders left
    there by processes of this machine that are gone (killed conversions) are removed first."""
    beside = Path(beside)
    beside.mkdir(parents=True, exist_ok=True)
    remove_abandoned_scratch(beside)
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{_process_name()}-", dir=beside))


def _process_name() -> str:
    """This process, as no other process that shares the folder names itself: its pid, its pid namespace (containers
    on one host may share the host name and the pids) and its host. The pid comes first: host names may hold dashes,
    pids and namespace numbers never do."""
    return f"{os.getpid()}-{_pid_namespace()}-{socket.gethostname()}"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def remove_abandoned_scratch(folder: Path) -> list[Path]:
    """Remove the scratch folders in ``folder`` made in this pid namespace of this machine by processes that no longer
    run; return them. Those of other machines or containers (a shared file system) and of running processes are left
    alone."""
    removed = []
    here = f"{_pid_namespace()}-{socket.gethostname()}"
    for candidate in folder.glob(f"{SCRATCH_PREFIX}*"):
        pid, _, rest = candidate.name.removeprefix(SCRATCH_PREFIX).partition("-")
        if not (pid.isdigit() and rest.rpartition("-")[0] == here) or _running(int(pid)):
            continue
        shutil.rmtree(candidate, ignore_errors=True)
        removed.append(candidate)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextmanager
def one_conversion_at_a_time(output: Path) -> Iterator[None]:
    """Hold the lock of the conversion that writes ``output`` (a file or a folder) for the block: a second job
    converting the same checkpoint (two runs resumed from it at once) waits here, then finds the output there to
    reuse, instead of each clearing the other's staged files. The lock is an empty hidden file beside ``output``,
    which its holder removes before letting go; a process that waited on it then finds it gone and locks a new one.
    One that a killed conversion leaves is taken by the next. Opening it raises as writing there would (a read-only
    folder); on a file system without locks the block runs unguarded, with a warning."""
    if sys.platform == "win32":
        yield
        return
    lock = output.parent / f"{WORKING_PREFIX}{output.name}.lock"
    while True:
        with open(lock, "a") as handle:
            if _take(handle.fileno(), lock, output):
                try:
                    yield
                finally:
                    lock.unlink(missing_ok=True)
                return


# Where flock is not there: Lustre mounted without -o flock, some FUSE file systems.
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)


def _take(descriptor: int, lock: Path, output: Path) -> bool:
    """Lock the file ``lock`` open as ``descriptor``, waiting for its holder; False where the holder removed it
    meanwhile (lock the new one). A file system without locks counts as locked."""
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            rank_zero_info(
                f"Another process is converting a checkpoint to {output}; waiting for it, to reuse what it writes."
            )
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        held = os.fstat(descriptor)
        named = lock.stat()
    except FileNotFoundError:
        return False
    except OSError as error:
        if error.errno == errno.ESTALE:  # NFS: the holder removed the file this process waited on
            return False
        if error.errno not in _NO_LOCKS:
            raise
        rank_zero_warn(
            f"The file system of {output.parent} has no locks ({error}): jobs converting this checkpoint at once are "
            "not kept apart. Start them one after another."
        )
        return True
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def files_fingerprint(folder: Path, leave_out: Collection[str] = ()) -> dict[str, list[int]]:
    """Size and modification time of every file below ``folder``, by path relative to it: what a conversion records
    of its source, so that a source saved again or copied over (even keeping older times, as sizes change) makes the
    output stale. Top-level entries that ``leave_out``'s names or glob patterns match and this project's working
    folders are not part of it; files that vanish while it looks (another process's staging) are not either."""

    def kept(name: str) -> bool:
        return not name.startswith(WORKING_PREFIX) and not any(fnmatch.fnmatchcase(name, left) for left in leave_out)

    found = {}
    for directory, folders, files in os.walk(folder):
        relative = Path(directory).relative_to(folder)
        if relative == Path("."):
            folders[:] = [name for name in folders if kept(name)]
            files = [name for name in files if kept(name)]
        for name in files:
            try:
                status = (Path(directory) / name).stat()
            except FileNotFoundError:
                continue
            found[(relative / name).as_posix()] = [status.st_size, status.st_mtime_ns]
    return dict(sorted(found.items()))


def read_record(path: Path) -> dict[str, Any] | None:
    """A JSON record a conversion wrote beside its output (what it was converted from), or None where there is none
    or it cannot be read: the output is then converted again."""
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None
