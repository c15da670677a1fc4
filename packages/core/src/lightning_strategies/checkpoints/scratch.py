"""What conversions leave beside a checkpoint: their scratch folders, and the record that tells their output stale.

A conversion may write as much as the model into a scratch folder (DeepSpeed's universal layout, mapped tensors).
Its name carries the process that made it, so that the next conversion in the same folder removes one whose process
is gone (killed mid-way, nothing removed it) instead of leaving it to fill the disk.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

# Every working folder of this project begins with it (staging of saves, scratch folders): never part of a checkpoint.
WORKING_PREFIX = ".lightning-strategies-"
SCRATCH_PREFIX = f"{WORKING_PREFIX}scratch-"


@contextmanager
def scratch_folder(beside: str | os.PathLike[str]) -> Iterator[Path]:
    """A hidden folder in ``beside`` for a conversion's intermediate files, removed afterwards; scratch folders left
    there by killed conversions on this machine are removed first."""
    beside = Path(beside)
    beside.mkdir(parents=True, exist_ok=True)
    remove_abandoned_scratch(beside)
    # pid first: host names may hold dashes, pids never do.
    prefix = f"{SCRATCH_PREFIX}{os.getpid()}-{socket.gethostname()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=beside) as folder:
        yield Path(folder)


def remove_abandoned_scratch(folder: Path) -> list[Path]:
    """Remove the scratch folders in ``folder`` made on this machine by processes that no longer run; return them.
    Those of other machines (a shared file system) and of running processes are left alone."""
    removed = []
    host = socket.gethostname()
    for candidate in folder.glob(f"{SCRATCH_PREFIX}*"):
        pid, _, rest = candidate.name.removeprefix(SCRATCH_PREFIX).partition("-")
        if not (pid.isdigit() and rest.rpartition("-")[0] == host) or _running(int(pid)):
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


def files_fingerprint(folder: Path, leave_out: Collection[str] = ()) -> dict[str, list[int]]:
    """Size and modification time of every file below ``folder``, by path relative to it: what a conversion records
    of its source, so that a source saved again or copied over (even keeping older times, as sizes change) makes the
    output stale. Top-level entries named in ``leave_out`` and this project's working folders are not part of it."""
    found = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        top = relative.parts[0]
        if top in leave_out or top.startswith(WORKING_PREFIX) or not path.is_file():
            continue
        status = path.stat()
        found[relative.as_posix()] = [status.st_size, status.st_mtime_ns]
    return found
