"""A CRC-32 for each shard file of a DCP folder: written by the rank that saved the file, checked by each rank
that reads it.

DCP records no checksum, so a shard damaged after saving (a partial copy, a failing disk) loads as other numbers.
``torch.save`` files carry a CRC-32 per record, which core checks; this gives DCP's shards the same. Each rank
writes ``.checksums-<rank>.json`` for its own files inside the staged folder, so the folder is published with
them. A folder without them (saved by Lightning's FSDPStrategy, or by DCP directly) loads unchecked.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

SHARD_SUFFIX = ".distcp"
_PATTERN = ".checksums-*.json"
_CHUNK = 16 << 20
# Files this process has verified, by (path, size, modification time): a model and its optimizers load from the
# same shards one after another, and reading them again proves nothing new.
_verified: set[tuple[str, int, int]] = set()


def write_checksums(folder: Path, rank: int) -> None:
    """Record the CRC-32 of the shards ``rank`` wrote into ``folder`` (DCP names them ``__<rank>_<n>.distcp``)."""
    sums = {path.name: crc32_of(path) for path in sorted(folder.glob(f"__{rank}_*{SHARD_SUFFIX}"))}
    (folder / f".checksums-{rank}.json").write_text(json.dumps(sums))


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
