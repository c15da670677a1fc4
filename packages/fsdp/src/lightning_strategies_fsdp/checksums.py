"""A CRC-32 for each shard file of a DCP folder: computed by the rank that saves the file as it writes it, checked
by each rank that reads it.

DCP records no checksum, so a shard damaged after saving (a partial copy, a failing disk) loads as other numbers.
``torch.save`` files carry a CRC-32 per record, which core checks; this gives DCP's shards the same. Each rank
writes ``.checksums-<rank>.json`` for its own files inside the staged folder, so the folder is published with
them. A folder without them (saved by Lightning's FSDPStrategy, or by DCP directly) loads unchecked.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from typing_extensions import override

SHARD_SUFFIX = ".distcp"
_PATTERN = ".checksums-*.json"
_CHUNK = 16 << 20
# Writes at least this large are summed beside the write rather than before it: below, a thread's hand-off costs
# more than the sum.
_OVERLAP_FROM = 1 << 20
# Files this process has verified, by (path, size, modification time): a model and its optimizers load from the
# same shards one after another, and reading them again proves nothing new.
_verified: set[tuple[str, int, int]] = set()


class _Crc32Stream:
    """A file being written, with the CRC-32 of every byte written to it so far: the shard is summed as it goes
    out, not read back. DCP writes shards front to back (``write``, ``tell``, ``flush``, ``fileno`` for fsync).

    A large write is summed on a second thread while this one writes it (both release the GIL), so the sum costs
    about nothing beside the disk; it is finished before ``write`` returns, while the caller's buffer is still
    valid, and in order, since each sum continues the last.
    """

    def __init__(self, stream: Any, summer: ThreadPoolExecutor) -> None:
        self.stream, self.summer, self.crc = stream, summer, 0

    def write(self, data: Any) -> int:
        if memoryview(data).nbytes < _OVERLAP_FROM:
            self.crc = zlib.crc32(data, self.crc)
            return self.stream.write(data)
        summed = self.summer.submit(zlib.crc32, data, self.crc)
        try:
            return self.stream.write(data)
        finally:
            self.crc = summed.result()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class _SummingFileSystem(FileSystem):
    """DCP's local file system, noting the CRC-32 of each shard file it writes in ``sums`` by file name."""

    def __init__(self, sums: dict[str, int]) -> None:
        super().__init__()
        self.sums = sums

    @override
    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode or not str(path).endswith(SHARD_SUFFIX):
                yield stream
                return
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-crc32") as summer:
                summed = _Crc32Stream(stream, summer)
                yield summed
            self.sums[Path(path).name] = summed.crc


def summing_writer(folder: Path) -> tuple[FileSystemWriter, dict[str, int]]:
    """A DCP storage writer for ``folder`` as ``dcp.save`` makes by default, and the CRC-32 of each shard it
    writes (filled as it writes)."""
    sums: dict[str, int] = {}
    writer = FileSystemWriter(folder)
    writer.fs = _SummingFileSystem(sums)
    return writer, sums


def write_checksums(folder: Path, rank: int, sums: dict[str, int]) -> None:
    """Record the CRC-32 of the shards ``rank`` wrote into ``folder`` (DCP names them ``__<rank>_<n>.distcp``)."""
    (folder / f".checksums-{rank}.json").write_text(json.dumps(dict(sorted(sums.items()))))


def saved_checksums(folder: Path) -> dict[str, int]:
    """Every shard's recorded CRC-32, by file name; a record that cannot be read counts as none."""
    sums: dict[str, int] = {}
    for path in folder.glob(_PATTERN):
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # the shards it describes are then only checked for presence and length, as before
        if isinstance(recorded, dict):
            sums.update({name: value for name, value in recorded.items() if isinstance(value, int)})
    return sums


def mismatches(folder: Path, names: set[str], sums: dict[str, int]) -> list[tuple[str, int, int]]:
    """(name, CRC-32 found, CRC-32 recorded) for each of ``names`` whose contents changed since it was saved."""
    found = []
    for name in sorted(names & sums.keys()):
        path = folder / name
        status = path.stat()
        key = (str(path.resolve()), status.st_size, status.st_mtime_ns)
        if key in _verified:
            continue
        actual = crc32_of(path)
        if actual != sums[name]:
            found.append((name, actual, sums[name]))
        else:
            _verified.add(key)
    return found


def crc32_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc
