"""Staging and checks for strategies that save through Lightning's CheckpointIO, in both Lightning
distributions (classes are matched by name)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lightning_strategies.checkpoints import (
    CheckpointFormat,
    check_checkpoint_file,
    check_trainer_checkpoint,
    convert_once,
    kept_form,
    on_rank_zero,
    one_file_for,
    reads_torch_save_files,
    scratch,
    scratch_folder,
    staged_checkpoint_io_save,
)
from lightning_strategies.checkpoints.checkpoint_io import ONE_FILE_NAME, ONE_FILE_SOURCE, writes_in_background
from lightning_strategies.checkpoints.scratch import SCRATCH_PREFIX
from lightning_strategies.errors import CheckpointError
from lightning_strategies.testing import checkpoint_layouts_described, written_by_another_package


class TorchCheckpointIO:  # stands for Lightning's, in either distribution
    pass


class AsyncCheckpointIO:
    def __init__(self, checkpoint_io: object) -> None:
        self.checkpoint_io = checkpoint_io


def test_background_writers_are_not_staged(tmp_path: Path) -> None:
    background = AsyncCheckpointIO(TorchCheckpointIO())
    assert writes_in_background(background) and not writes_in_background(TorchCheckpointIO())
    with staged_checkpoint_io_save(tmp_path / "last.ckpt", background, True, lambda: None) as path:
        assert path == tmp_path / "last.ckpt"  # publishing after the call would rename a file still being written
    with staged_checkpoint_io_save(tmp_path / "last.ckpt", TorchCheckpointIO(), True, lambda: None) as path:
        assert path != tmp_path / "last.ckpt"
        torch.save({"state_dict": {}}, path)
    assert (tmp_path / "last.ckpt").is_file()


def test_only_torch_save_files_are_checked_as_such() -> None:
    assert reads_torch_save_files(TorchCheckpointIO())
    assert reads_torch_save_files(AsyncCheckpointIO(TorchCheckpointIO()))
    assert not reads_torch_save_files(object())  # a plugin with its own format checks its own files


def test_a_folder_of_another_strategy_is_named(tmp_path: Path) -> None:
    # Core's tests run without any strategy package: the layout's package is stood in for.
    (tmp_path / "other.ckpt").mkdir()
    refused = pytest.raises(CheckpointError, match=r"another package's checkpoint.*another-package-convert")
    with written_by_another_package(tmp_path / "other.ckpt"), refused:
        check_checkpoint_file(tmp_path / "other.ckpt", TorchCheckpointIO(), "XLAStrategy")


def test_a_bare_state_dict_is_not_a_trainer_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no 'state_dict' entry.*model.load_state_dict"):
        check_trainer_checkpoint({"weight": torch.ones(1)}, tmp_path / "weights.pt")
    check_trainer_checkpoint({"state_dict": {}}, tmp_path / "model.ckpt")


class _Strategy:  # one process: what one_file_for asks of a strategy
    is_global_zero = True

    def broadcast(self, obj: object) -> object:
        return obj

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision


def _write_whole(source: str, destination: str, weights_only: bool | None) -> None:
    torch.save({"state_dict": {"w": torch.ones(1)}, "optimizer_states": [{}], "from": str(source)}, destination)


def _fail(source: str, destination: str, weights_only: bool | None) -> None:
    raise RuntimeError("shard 1 is unreadable")


def _convertible(path: Path, converter: str) -> contextlib.AbstractContextManager[None]:
    layout = CheckpointFormat(
        "convertible",
        "a folder of shards",
        "the sharding strategies",
        "`convert {path} full.ckpt`",
        lambda candidate: candidate == path,
        to_full_checkpoint=f"{__name__}:{converter}",
        derived=("*-universal",),
    )
    return checkpoint_layouts_described(layout)


def test_a_folder_whose_conversion_carries_everything_is_read_as_one_file(tmp_path: Path) -> None:
    """Issue 29 item 2: ddp resumes an FSDP2 DCP folder by ckpt_path alone, through its one-file form."""
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()
    with _convertible(folder, "_write_whole"):
        assert one_file_for(folder, _Strategy()) == str(folder / ONE_FILE_NAME)
        written = (folder / ONE_FILE_NAME).stat().st_mtime_ns
        assert one_file_for(folder, _Strategy()) == str(folder / ONE_FILE_NAME)  # reused, not written again
        assert (folder / ONE_FILE_NAME).stat().st_mtime_ns == written
        # The folder saved again in place (Lightning's FSDPStrategy does): its one-file form is stale, written again.
        (folder / "__0_0.distcp").write_bytes(b"newer shard")
        assert one_file_for(folder, _Strategy()) == str(folder / ONE_FILE_NAME)
        assert (folder / ONE_FILE_NAME).stat().st_mtime_ns != written
        check_checkpoint_file(folder / ONE_FILE_NAME, TorchCheckpointIO(), "DDPStrategy")
        # A file in a sub-folder (ZeRO's tag folder) added, then another run's copied over it keeping its older time
        # (cp -p): stale each time.
        shard = folder / "checkpoint" / "mp_rank_00_model_states.pt"
        shard.parent.mkdir()
        shard.write_bytes(b"this run's")
        for _ in range(2):
            written = (folder / ONE_FILE_NAME).stat().st_mtime_ns
            assert one_file_for(folder, _Strategy()) == str(folder / ONE_FILE_NAME)
            assert (folder / ONE_FILE_NAME).stat().st_mtime_ns != written
            old_time = shard.stat().st_mtime_ns
            shard.write_bytes(b"another run's")
            os.utime(shard, ns=(old_time, old_time))
        # What a strategy derives inside the folder from the saved files (DeepSpeed's universal form of tag
        # "checkpoint", written on a resume elsewhere) leaves the one-file form current.
        assert one_file_for(folder, _Strategy()) == str(folder / ONE_FILE_NAME)
        written = (folder / ONE_FILE_NAME).stat().st_mtime_ns
        (folder / "checkpoint-universal").mkdir()
        (folder / "checkpoint-universal" / "latest_universal").write_text("checkpoint_universal")
        assert one_file_for(folder, _Strategy()) == str(folder / ONE_FILE_NAME)
        assert (folder / ONE_FILE_NAME).stat().st_mtime_ns == written
        # So does what another package keeps inside it, converted to its own layout (DeepSpeed's universal form).
        kept_form(folder, "deepspeed").mkdir()
        (kept_form(folder, "deepspeed") / "latest_universal").write_text("checkpoint_universal")
        assert one_file_for(folder, _Strategy()) == str(folder / ONE_FILE_NAME)
        assert (folder / ONE_FILE_NAME).stat().st_mtime_ns == written
        # A conversion killed after writing the file but before recording its source: converted again.
        (folder / ONE_FILE_SOURCE).unlink()
        assert one_file_for(folder, _Strategy()) == str(folder / ONE_FILE_NAME)
        assert (folder / ONE_FILE_NAME).stat().st_mtime_ns != written
    file = tmp_path / "model.ckpt"
    torch.save({"state_dict": {}}, file)
    assert one_file_for(file, _Strategy()) == file  # one file already
    with written_by_another_package(tmp_path / "other.ckpt"):  # a layout without to_full_checkpoint: left to refuse
        (tmp_path / "other.ckpt").mkdir()
        assert one_file_for(tmp_path / "other.ckpt", _Strategy()) == tmp_path / "other.ckpt"


def waiting_for_the_lock(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a conversion waits for another's lock (the blocking flock after the try failed)."""
    waiting, flock = threading.Event(), scratch.fcntl.flock

    def watched(descriptor: int, operation: int) -> None:
        if operation == scratch.fcntl.LOCK_EX:
            waiting.set()
        flock(descriptor, operation)

    monkeypatch.setattr(scratch.fcntl, "flock", watched)
    return waiting


def test_jobs_converting_one_source_at_once_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs resumed from one folder at once (threads here: each opens the lock as a process of its own would):
    the second waits for the first's conversion and reuses it, rather than clearing its staged files."""
    output, record = tmp_path / ONE_FILE_NAME, tmp_path / ONE_FILE_SOURCE
    source = {"files": {"__0_0.distcp": [100, 1]}}
    inside, finish = threading.Event(), threading.Event()
    waiting = waiting_for_the_lock(monkeypatch)
    calls: list[str] = []
    reused: dict[str, bool] = {}

    def first_converts() -> None:
        calls.append("first")
        inside.set()
        finish.wait(30)
        output.write_text("converted")

    def job(name: str, convert: Callable[[], object]) -> threading.Thread:
        def resume() -> None:
            reused[name] = convert_once(output, record, source, convert)

        thread = threading.Thread(target=resume)
        thread.start()
        return thread

    first = job("first", first_converts)
    assert inside.wait(30)
    second = job("second", lambda: calls.append("second"))
    assert waiting.wait(30)  # for the first's lock
    finish.set()
    first.join(30)
    second.join(30)
    assert reused == {"first": False, "second": True} and calls == ["first"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [ONE_FILE_NAME, ONE_FILE_SOURCE]  # no lock left


def test_a_file_system_without_locks_converts_unguarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lustre mounted without ``-o flock`` answers ENOSYS; a stand-in says so here, where every file system locks."""

    def no_locks(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(scratch.fcntl, "flock", no_locks)
    output = tmp_path / ONE_FILE_NAME
    with pytest.warns(UserWarning, match="has no locks .* Start them one after another"):
        assert not convert_once(output, tmp_path / ONE_FILE_SOURCE, {"files": {}}, lambda: output.write_text("done"))
    assert convert_once(output, tmp_path / ONE_FILE_SOURCE, {"files": {}}, pytest.fail)


def test_a_failed_conversion_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()
    refused = pytest.raises(
        CheckpointError,
        match=r"a folder of shards.*shard 1 is unreadable.*the sharding strategies, or convert it where you can "
        r"write \(`lightning-strategies convert .*sharded.ckpt OUT.ckpt --to full`\) and resume from OUT.ckpt",
    )
    with _convertible(folder, "_fail"), refused:
        one_file_for(folder, _Strategy())
    assert not (folder / ONE_FILE_NAME).exists()


def test_a_rank_that_does_not_see_the_converted_file_says_so(tmp_path: Path) -> None:
    """Another node without the folder on a shared file system: rank 0 converted, this rank finds nothing, and
    follows rank 0's answer rather than its own view of the folder (which it does not see at all)."""
    folder = tmp_path / "sharded.ckpt"

    class OtherNode(_Strategy):
        is_global_zero = False

        def broadcast(self, obj: object) -> object:  # what rank 0 answered: (the file to load, no failure)
            return str(folder / ONE_FILE_NAME), None

    with pytest.raises(CheckpointError, match=r"this process does not see it.*one shared file system.*convert"):
        one_file_for(folder, OtherNode())


def test_rank_zero_is_told_when_another_node_does_not_see_the_converted_file(tmp_path: Path) -> None:
    """Rank 0 sees what it wrote; it must stop too, or it would go on into collectives the other node never joins."""
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()

    class AnotherNodeBlind(_Strategy):
        def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
            assert decision and all  # this process sees it; the other's False wins
            return False

    with _convertible(folder, "_write_whole"), pytest.raises(CheckpointError, match=r"another process does not see it"):
        one_file_for(folder, AnotherNodeBlind())


def test_work_of_rank_zero_reaches_every_rank_and_so_does_its_failure() -> None:
    """on_rank_zero: the other ranks take rank 0's answer, never their own (they run nothing)."""

    class OtherRank(_Strategy):
        is_global_zero = False

        def __init__(self, answer: tuple[object, str | None]) -> None:
            self.answer = answer

        def broadcast(self, obj: object) -> object:
            assert obj == (None, None)  # this rank ran nothing
            return self.answer

    def never() -> str:
        raise AssertionError("only rank 0 works")

    assert on_rank_zero(_Strategy(), lambda: "converted") == "converted"
    assert on_rank_zero(OtherRank(("converted", None)), never) == "converted"
    with pytest.raises(CheckpointError, match=r"^shard 1 is unreadable: resume on 2 processes$"):
        on_rank_zero(OtherRank((None, "shard 1 is unreadable: resume on 2 processes")), never)

    def unreadable() -> str:
        raise OSError("shard 1 is unreadable")

    with pytest.raises(CheckpointError, match=r"^OSError: shard 1 is unreadable$"):  # described: the error's type too
        on_rank_zero(_Strategy(), unreadable)
    with pytest.raises(CheckpointError, match=r"^read on rank 0: shard 1 is unreadable$"):  # a caller's own words
        on_rank_zero(_Strategy(), unreadable, lambda error: f"read on rank 0: {error}")

    def broken_words(error: Exception) -> str:
        raise KeyError("no such setting")

    with pytest.raises(CheckpointError, match=r"^OSError: shard 1 is unreadable$"):  # still reaches every rank
        on_rank_zero(_Strategy(), unreadable, broken_words)


def test_a_scratch_folder_left_by_a_killed_conversion_is_removed_by_the_next(tmp_path: Path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(ended.stdout)  # a process of this machine that has ended
    here = f"{os.stat('/proc/self/ns/pid').st_ino}-{socket.gethostname()}"
    abandoned = tmp_path / f"{SCRATCH_PREFIX}{dead}-{here}-abc123"
    running = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-{here}-def456"
    elsewhere = tmp_path / f"{SCRATCH_PREFIX}{dead}-1-another-host-ghi789"  # a shared file system's other machine
    container = tmp_path / f"{SCRATCH_PREFIX}{dead}-1-{socket.gethostname()}-jkl012"  # the same host name, other pids
    for folder in (abandoned, running, elsewhere, container):
        folder.mkdir()
        (folder / "universal.pt").write_bytes(b"as large as the model")
    with scratch_folder(tmp_path) as scratch:
        assert scratch.is_dir() and scratch.name.startswith(f"{SCRATCH_PREFIX}{os.getpid()}-{here}-")
        assert not abandoned.exists() and running.exists() and elsewhere.exists() and container.exists()
    assert not scratch.exists()
