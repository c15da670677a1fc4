"""The shard sums of checksums.py in one process, without DCP: pieces summed as written, across the writes' own
boundaries, equal the file's pieces read back; damage is found in the piece it is in; a record of a whole file's one
CRC-32 (folders saved before pieces were summed) is still checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_strategies_fsdp import checksums

PIECE = 1000  # small pieces, so that a few kilobytes cross several boundaries
# Writes of every kind: inside a piece, across one and several boundaries, ending on one, empty, summed in the
# writing thread (below the hand-off size) and on the summing threads.
WRITES = [10, 1500, 490, 2990, 0, 7, 1013]  # 6,010 bytes: the last piece short


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksums, "PIECE", PIECE)
    monkeypatch.setattr(checksums, "_HAND_OFF_FROM", 100)


def write_shard(folder: Path, name: str = "__0_0.distcp") -> Path:
    sums: dict[str, checksums.Record] = {}
    data = bytes(range(256)) * 40
    with checksums._SummingFileSystem(sums).create_stream(folder / name, "wb") as stream:
        offset = 0
        for size in WRITES:
            stream.write(memoryview(data)[offset : offset + size])
            offset += size
    checksums.write_checksums(folder, 0, sums)
    return folder / name


def test_pieces_summed_while_writing_are_those_of_the_file(small_pieces: None, tmp_path: Path) -> None:
    shard = write_shard(tmp_path)
    record = checksums.saved_checksums(tmp_path)[shard.name]
    assert record == {"piece_bytes": PIECE, "crc32": checksums.piece_crc32s(shard, PIECE)}
    assert len(record["crc32"]) == -(-sum(WRITES) // PIECE) == 7
    assert checksums.mismatches(tmp_path, {shard.name}, checksums.saved_checksums(tmp_path)) == []


def test_damage_is_found_in_its_piece(small_pieces: None, tmp_path: Path) -> None:
    shard = write_shard(tmp_path)
    damaged = bytearray(shard.read_bytes())
    damaged[2500] ^= 0xFF
    shard.write_bytes(damaged)
    ((name, difference),) = checksums.mismatches(tmp_path, {shard.name}, checksums.saved_checksums(tmp_path))
    assert name == shard.name
    assert difference.startswith("its CRC-32 over bytes 2000 to 3000 is ")

    shard.write_bytes(damaged[:-1500])
    ((_, difference),) = checksums.mismatches(tmp_path, {shard.name}, checksums.saved_checksums(tmp_path))
    assert difference == "it holds 5 pieces of 1000 bytes, where the save wrote 7"


def test_a_whole_file_record_is_still_checked(tmp_path: Path) -> None:
    shard = write_shard(tmp_path)
    (tmp_path / ".checksums-0.json").write_text(json.dumps({shard.name: checksums.crc32_of(shard)}))
    assert checksums.mismatches(tmp_path, {shard.name}, checksums.saved_checksums(tmp_path)) == []
    checksums._verified.clear()  # verified once, this process would not read it again: it is changed below
    shard.write_bytes(b"\xff" + shard.read_bytes()[1:])  # its first byte was 0
    ((_, difference),) = checksums.mismatches(tmp_path, {shard.name}, checksums.saved_checksums(tmp_path))
    assert difference.startswith("its CRC-32 is ") and "where the save recorded" in difference


def test_an_unreadable_record_counts_as_none(tmp_path: Path) -> None:
    (tmp_path / ".checksums-0.json").write_text(json.dumps({"a.distcp": {"piece_bytes": 0, "crc32": [1]}, "b": "x"}))
    (tmp_path / ".checksums-1.json").write_text("{not json")
    assert checksums.saved_checksums(tmp_path) == {}
