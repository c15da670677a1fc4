"""One checkpoint layout into another, for the ``lightning-strategies convert`` command.

Core knows no backend's layout: each step goes through what the package of that layout answers in its
``CheckpointFormat``. Into one full file: the source format's ``to_full_checkpoint`` (everything a resume restores),
or its ``read_weights`` where that is all it has, only once the user agreed to lose the optimizer states. Into another
layout: the target format's ``from_full_checkpoint``, from the full file (the source itself, or a temporary one
beside the output). A layout its package cannot write exactly from one file is refused with what to do instead.
The output appears only once completely written, and nothing at its path is ever replaced.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lightning_strategies.checkpoints.formats import FILE, CheckpointFormat, identify, installed_formats
from lightning_strategies.checkpoints.loading import check_file
from lightning_strategies.checkpoints.scratch import WORKING_PREFIX, scratch_folder
from lightning_strategies.checkpoints.staging import staged_save
from lightning_strategies.errors import CheckpointError
from lightning_strategies.known import CONVERT_TARGETS, providing_distribution

# What a result built from ``read_weights`` lacks; the refusal and the output both name it.
OPTIMIZER_STATES = (
    "the optimizer states (for Adam: the moments exp_avg and exp_avg_sq and the step counts of every parameter)"
)
DROP_FLAG = "--drop-optimizer-states"
# Seconds between the lines saying how much a conversion has written.
PROGRESS_EVERY = 10.0


@dataclass
class Conversion:
    """What ``convert`` did: ``written`` is None where the source already had the asked layout."""

    source_format: CheckpointFormat
    target_format: CheckpointFormat
    written: Path | None
    dropped: str = ""
    notes: list[str] = field(default_factory=list)


def target_format(name: str, formats: list[CheckpointFormat] | None = None) -> CheckpointFormat:
    """The layout ``--to name`` asks for, from the installed packages' formats (``convert_name``)."""
    for candidate in (*(installed_formats() if formats is None else formats), FILE):
        if candidate.convert_name == name:
            return candidate
    distribution = providing_distribution(name)
    if distribution is not None:
        raise CheckpointError(
            f"--to {name}: that layout is written by {distribution}, which is not installed here: "
            f"pip install {distribution}"
        )
    raise CheckpointError(
        f"--to {name}: no installed package writes such a layout; choose one of {', '.join(CONVERT_TARGETS)}."
    )


def convert(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    to: str,
    weights_only: bool | None = None,
    drop_optimizer_states: bool = False,
    report: Callable[[str], None] = lambda line: None,
) -> Conversion:
    """Write the checkpoint at ``source`` in the layout ``to`` (one of ``CONVERT_TARGETS``) at ``out``, a path where
    nothing is yet. ``weights_only`` is torch.load's, for the files read; ``drop_optimizer_states`` agrees to a result
    without the optimizer states where the source's layout cannot be read with them. ``report`` gets one line per
    step."""
    source, out = Path(source), Path(out)
    found = source_format(source)
    target = target_format(to)
    if found == target and not (target == FILE and drop_optimizer_states):
        return Conversion(found, target, None, notes=[f"{source} is {found.description} already: nothing to convert."])
    if out.exists() or out.is_symlink():
        raise CheckpointError(
            f"{out} exists already; convert writes a new checkpoint and overwrites nothing. Choose another path, or "
            "remove that one first."
        )
    if target != FILE and not target.from_full_checkpoint:
        raise CheckpointError(
            f"--to {to}: no installed package writes {target.description} from {found.description} without losing "
            f"part of it. Resume it with {found.read_by}, or write one full file with --to full."
        )
    dropped = _check_full_route(source, found, drop_optimizer_states)
    report(f"reading {source}: {found.description}, {_size_text(source)}")
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    with _progress(out.parent, _size(source), report):
        if target == FILE:
            _write_full(found, source, out, weights_only, drop_optimizer_states or bool(dropped), report)
        elif found == FILE and not drop_optimizer_states:
            _write_from_full(target, source, out, weights_only, report)
        else:
            # Beside the output, so that the full file is written on the file system with room for the output.
            with scratch_folder(out.parent) as folder:
                full = folder / "full.ckpt"
                _write_full(found, source, full, weights_only, drop_optimizer_states or bool(dropped), report)
                _write_from_full(target, full, out, weights_only, report)
    report(f"done: {out} ({_size_text(out)}) in {time.monotonic() - started:.1f} s")
    written = identify(out) or target
    weights_alone = bool(dropped) or drop_optimizer_states
    notes = [f"{out} is {written.description}; {'load' if weights_alone else 'resume'} it with {target.read_by}."]
    if weights_alone:
        notes.append(
            f"It holds the weights and Lightning's state but not {OPTIMIZER_STATES}: it serves validate, test, "
            "predict and load_from_checkpoint, and a strategy's loading of full weights, where the optimizer starts "
            "afresh."
        )
    dropped = dropped or (OPTIMIZER_STATES if drop_optimizer_states else "")
    return Conversion(found, target, out, dropped=dropped, notes=notes)


def source_format(source: Path) -> CheckpointFormat:
    """The layout of the checkpoint at ``source``; a missing, damaged or unknown one refused in words."""
    if not source.exists():
        raise CheckpointError(f"No checkpoint at {source}. Check the path.")
    found = identify(source)
    if found is None and source.is_file():
        check_file(source)  # a damaged checkpoint file is told as such, not as a foreign one
    if found is None:
        raise CheckpointError(
            f"{source} is no checkpoint layout that the installed strategy packages know. Check the path: it should "
            "be what a strategy's save_checkpoint (or ModelCheckpoint) wrote. If another strategy package wrote it, "
            "install that package (`lightning-strategies list` shows what is installed)."
        )
    return found


def _check_full_route(source: Path, found: CheckpointFormat, drop_optimizer_states: bool) -> str:
    """What reading ``source`` into one file drops (empty: nothing), refusing it unless the user agreed."""
    if found == FILE or found.to_full_checkpoint:
        return ""
    if not found.read_weights:
        raise CheckpointError(
            f"{source} is {found.description}, which its package cannot read into one file here. "
            f"{found.to_full_weights.format(path=source)}."
        )
    if not drop_optimizer_states:
        raise CheckpointError(
            f"{source} is {found.description}; its package reads it into one file of the weights and Lightning's "
            f"state (loops, schedulers, callbacks) but drops {OPTIMIZER_STATES}, so a run resumed from the result "
            f"would start its optimizer afresh. Add {DROP_FLAG} to write it anyway; to keep them, resume it with "
            f"{found.read_by}."
        )
    return OPTIMIZER_STATES


def _write_full(
    found: CheckpointFormat,
    source: Path,
    out: Path,
    weights_only: bool | None,
    weights_alone: bool,
    report: Callable[[str], None],
) -> None:
    if weights_alone or not found.to_full_checkpoint:
        report(f"reading the weights of {source} (the optimizer states are left out)")
        checkpoint = _call(found.read_weights, source, weights_only)
        dropped = _optimizer_entries(checkpoint)
        for key in dropped:
            del checkpoint[key]
        if dropped:
            report(f"left out: {', '.join(map(repr, dropped))}")
        report(f"writing {out}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with staged_save(out) as staged:
            torch.save(checkpoint, staged)
        return
    report(f"writing {out}: one file with the weights, optimizer states, schedulers and loop state")
    _call(found.to_full_checkpoint, source, out, weights_only)


def _optimizer_entries(checkpoint: dict[str, Any]) -> list[str]:
    """The entries holding optimizer states: the Trainer's ``optimizer_states``, and any optimizer state dict (its
    ``state`` and ``param_groups``) that Fabric saved under the user's own key."""
    return [
        key
        for key, value in checkpoint.items()
        if key == "optimizer_states" or (isinstance(value, dict) and {"state", "param_groups"} <= value.keys())
    ]


def _write_from_full(
    target: CheckpointFormat, full: Path, out: Path, weights_only: bool | None, report: Callable[[str], None]
) -> None:
    report(f"writing {out} (--to {target.convert_name})")
    _call(target.from_full_checkpoint, full, out, weights_only)


def _call(named: str, *arguments: Any) -> Any:
    module, _, function = named.partition(":")
    return getattr(importlib.import_module(module), function)(*arguments)


@contextmanager
def _progress(folder: Path, source_bytes: int, report: Callable[[str], None]) -> Iterator[None]:
    """Every ``PROGRESS_EVERY`` seconds while the body runs, one line of how much it has written: every step writes
    into hidden working folders beside the output (staged saves, temporary files, scratch layouts), named alike."""
    stopped = threading.Event()

    def watch() -> None:
        while not stopped.wait(PROGRESS_EVERY):
            written = sum(_size(path) for path in folder.glob(f"{WORKING_PREFIX}*"))
            report(f"... {_bytes_text(written)} written so far (the source holds {_bytes_text(source_bytes)})")

    watcher = threading.Thread(target=watch, name="convert-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stopped.set()
        watcher.join()


def _size(path: Path) -> int:
    """Bytes of the file at ``path``, or of every file below it; what vanishes meanwhile counts as none."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for item in path.rglob("*"):
        with contextlib.suppress(OSError):
            total += item.stat().st_size if item.is_file() else 0
    return total


def _bytes_text(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"


def _size_text(path: Path) -> str:
    files = [path] if path.is_file() else [item for item in path.rglob("*") if item.is_file()]
    shown = _bytes_text(sum(item.stat().st_size for item in files))
    return shown if path.is_file() else f"{len(files)} file(s), {shown}"
