"""A CRC-32 of each 8 MiB piece of each shard file of a DCP folder: computed by the rank that saves the file as it
writes it, checked by each rank that reads it.

DCP records no checksum, so a shard damaged after saving (a partial copy, a failing disk) loads as other numbers.
``torch.save`` files carry a CRC-32 per record, which core checks; this gives DCP's shards the same. Each rank
writes ``.checksums-<rank>.json`` for its own files inside the staged folder, so the folder is published with
them. A folder without them (saved by Lightning's FSDPStrategy, or by DCP directly) loads unchecked.

One sum per piece rather than per file, so that the pieces are summed on several threads: a rank writes its shard
as one file, and one thread sums about 2.6 GB/s (an H200 machine's host), slower than the save's write and far
slower than a load's read. Pieces are small enough that one tensor's write (16 to 64 MiB at 1.3B) spans several.
Records of a whole file's one CRC-32 (written before pieces were) are still checked.
"""

from __future__ import annotations

import json
import os
import threading
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
PIECE = 8 << 20
# Threads summing one file's pieces, on save and on load (each holds one piece while it reads).
_THREADS = max(1, min(4, os.cpu_count() or 1))
# Writes below this are summed in the writing thread: a thread's hand-off costs more than their sum.
_HAND_OFF_FROM = 1 << 20
# Files this process has verified, by (path, size, modification time): a model and its optimizers load from the
# same shards one after another, and reading them again proves nothing new.
_verified: set[tuple[str, int, int]] = set()


class _PieceSummingStream:
    """A file being written, with the CRC-32 of each ``PIECE`` bytes written to it (the last piece shorter): the shard
    is summed as it goes out, not read back. DCP writes shards front to back (``write``, ``tell``, ``flush``,
    ``fileno`` for fsync).

    A large write's pieces are summed on other threads while this one writes it (all release the GIL), finished
    before ``write`` returns, while the caller's buffer is still valid. Only a write's first piece can continue a
    piece an earlier write began, whose sum is known by then; its other pieces start afresh.
    """

    def __init__(self, stream: Any, summer: ThreadPoolExecutor) -> None:
        self.stream, self.summer = stream, summer
        self.sums: list[int] = []
        self.position = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        pieces = list(self._pieces(view))
        if view.nbytes < _HAND_OFF_FROM:
            for index, start, piece in pieces:
                self._note(index, zlib.crc32(piece, start))
            return self.stream.write(data)
        summed = [(index, self.summer.submit(zlib.crc32, piece, start)) for index, start, piece in pieces]
        try:
            return self.stream.write(data)
        finally:
            for index, future in summed:
                self._note(index, future.result())

    def _pieces(self, view: memoryview) -> Iterator[tuple[int, int, memoryview]]:
        """(piece index, the CRC-32 it continues, bytes) for each piece of ``view``, written at the position."""
        offset = 0
        while offset < view.nbytes:
            index, within = divmod(self.position, PIECE)
            size = min(PIECE - within, view.nbytes - offset)
            yield index, self.sums[index] if within else 0, view[offset : offset + size]
            offset += size
            self.position += size

    def _note(self, index: int, crc: int) -> None:
        if index == len(self.sums):
            self.sums.append(crc)
        else:
            self.sums[index] = crc

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


# What a rank records for each shard: the CRC-32 of each piece ({"piece_bytes": PIECE, "crc32": [...]}), or, in
# folders saved before pieces were summed, the whole file's one CRC-32.
Record = dict[str, Any] | int


class _SummingFileSystem(FileSystem):
    """DCP's local file system, noting the sums of each shard file it writes in ``sums`` by file name."""

    def __init__(self, sums: dict[str, Record]) -> None:
        super().__init__()
        self.sums = sums

    @override
    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode or not str(path).endswith(SHARD_SUFFIX):
                yield stream
                return
            with ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="shard-crc32") as summer:
                summed = _PieceSummingStream(stream, summer)
                yield summed
            self.sums[Path(path).name] = {"piece_bytes": PIECE, "crc32": summed.sums}


def summing_writer(folder: Path) -> tuple[FileSystemWriter, dict[str, Record]]:
    """A DCP storage writer for ``folder`` as ``dcp.save`` makes by default, and the sums of each shard it writes
    (filled as it writes)."""
    sums: dict[str, Record] = {}
    writer = FileSystemWriter(folder)
    writer.fs = _SummingFileSystem(sums)
    return writer, sums


def write_checksums(folder: Path, rank: int, sums: dict[str, Record]) -> None:
    """Record the sums of the shards ``rank`` wrote into ``folder`` (DCP names them ``__<rank>_<n>.distcp``)."""
    (folder / f".checksums-{rank}.json").write_text(json.dumps(dict(sorted(sums.items()))))


def saved_checksums(folder: Path) -> dict[str, Record]:
    """Every shard's recorded sums, by file name; a record that cannot be read counts as none."""
    sums: dict[str, Record] = {}
    for path in folder.glob(_PATTERN):
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # the shards it describes are then only checked for presence and length, as before
        if isinstance(recorded, dict):
            sums.update({name: value for name, value in recorded.items() if _is_record(value)})
    return sums


def _is_record(value: Any) -> bool:
    """A record as ``_SummingFileSystem`` writes it (bools are no ints here; pieces past 1 GiB none of ours)."""
    if isinstance(value, dict):
        piece, crcs = value.get("piece_bytes"), value.get("crc32")
        return type(piece) is int and 0 < piece <= 1 << 30 and isinstance(crcs, list) and all(map(_is_crc, crcs))
    return _is_crc(value)


def _is_crc(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 32


def mismatches(folder: Path, names: set[str], sums: dict[str, Record]) -> list[tuple[str, str]]:
    """(name, what differs) for each of ``names`` whose contents changed since it was saved."""
    found = []
    for name in sorted(names & sums.keys()):
        path = folder / name
        status = path.stat()
        key = (str(path.resolve()), status.st_size, status.st_mtime_ns)
        if key in _verified:
            continue
        difference = _difference(path, sums[name])
        if difference:
            found.append((name, difference))
        else:
            _verified.add(key)
    return found


def _difference(path: Path, record: Record) -> str:
    """What in ``path`` differs from its record ("" where nothing does)."""
    if isinstance(record, int):
        actual = crc32_of(path)
        return "" if actual == record else f"its CRC-32 is {actual:08x}, where the save recorded {record:08x}"
    piece, recorded = record["piece_bytes"], record["crc32"]
    actual_sums = piece_crc32s(path, piece)
    if len(actual_sums) != len(recorded):
        return f"it holds {len(actual_sums)} pieces of {piece} bytes, where the save wrote {len(recorded)}"
    for index, (actual, expected) in enumerate(zip(actual_sums, recorded, strict=True)):
        if actual != expected:
            return (
                f"its CRC-32 over bytes {index * piece} to {(index + 1) * piece} is {actual:08x}, where the save "
                f"recorded {expected:08x}"
            )
    return ""


def piece_crc32s(path: Path, piece: int = PIECE) -> list[int]:
    """The CRC-32 of each ``piece`` bytes of ``path`` (the last piece shorter), read and summed on several threads."""

    buffers = threading.local()  # one buffer a thread, filled again for each piece: no allocation per piece

    def summed(index: int) -> int:
        if not hasattr(buffers, "view"):
            buffers.view = memoryview(bytearray(piece))
        with open(path, "rb") as file:  # buffered: its readinto fills the buffer, however short each read
            file.seek(index * piece)
            size = file.readinto(buffers.view)
        return zlib.crc32(buffers.view[:size])

    count = -(-path.stat().st_size // piece)
    with ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="shard-crc32") as summer:
        return list(summer.map(summed, range(count)))


def crc32_of(path: Path) -> int:
    """The whole file's CRC-32, as records written before pieces were summed hold it."""
    crc = 0
    with open(path, "rb") as file:
        while block := file.read(PIECE):
            crc = zlib.crc32(block, crc)
    return crc
