"""Work on a checkpoint that global rank 0 does for every rank: converting another layout, reading what a file holds.

Every rank calls ``on_rank_zero`` together. Rank 0 runs the work; the others wait for its answer in a broadcast, so
no rank leaves the collective because it sees the checkpoint otherwise (a node without the shared file system sees
nothing), and a failure on rank 0 ends every rank with the same ``CheckpointError`` instead of leaving the others
waiting for it forever. What rank 0 wrote, every rank then checks that all of them see (``check_seen``). A form of a
checkpoint that rank 0 makes for every rank to load (``form_for_the_load``) is kept where its maker keeps it, or
lives in a scratch folder for the load alone.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from lightning_strategies.checkpoints.scratch import new_scratch
from lightning_strategies.checkpoints.staging import every_rank_left
from lightning_strategies.errors import CheckpointError

Result = TypeVar("Result")


def described(error: Exception) -> str:
    """A ``CheckpointError``'s own words (they name the problem and the fix), else the error's type and message."""
    return str(error) if isinstance(error, CheckpointError) else f"{type(error).__name__}: {error}"


def on_rank_zero(strategy: Any, work: Callable[[], Result], failure: Callable[[Exception], str] = described) -> Result:
    """``work()`` run on global rank 0 and its result broadcast to every rank; where it raises, every rank raises a
    ``CheckpointError`` saying ``failure(error)`` (a plain ``CheckpointError``, whatever the error's own class was).
    ``strategy`` gives ``is_global_zero`` and ``broadcast``."""
    answer: tuple[Any, str | None] = (None, None)
    if strategy.is_global_zero:
        try:
            answer = (work(), None)
        except Exception as error:
            try:
                answer = (None, failure(error))
            except Exception:  # the words failed: the others wait in the broadcast all the same
                answer = (None, described(error))
    result, message = strategy.broadcast(answer)
    if message is not None:
        raise CheckpointError(message)
    return result


def check_seen(strategy: Any, path: str | Path, what: str, by_hand: str) -> None:
    """Refuse to go on, on every rank, where any process does not see ``path``, which rank 0 wrote (``what`` it is) a
    moment ago: rank 0 always sees it, and would go on into collectives the blind process never joins. ``by_hand``:
    the command that converts it where each node sees it. ``strategy`` gives ``reduce_boolean_decision``."""
    seen_here = Path(path).exists()
    if not strategy.reduce_boolean_decision(seen_here, all=True):
        where = "this process does not" if not seen_here else "another process does not"
        raise CheckpointError(
            f"Rank 0 wrote {what} at {path}, but {where} see it there: every node must see the checkpoint on one "
            f"shared file system. Convert it where each node sees it ({by_hand}) and resume from what that writes."
        )


@contextmanager
def form_for_the_load(
    strategy: Any,
    make: Callable[[Callable[[Path], Path]], tuple[Path, str]],
    failure: Callable[[Exception], str],
    seen: str,
    what: str,
    by_hand: str,
) -> Iterator[tuple[Path, str]]:
    """A form of a checkpoint (another layout of it) that global rank 0 makes and every rank loads within the block:
    ``make(scratch)`` runs on rank 0 (``on_rank_zero``, its failure told by ``failure``) and returns where the form
    is and how it came to be there, for the log. Where it keeps the form (inside the checkpoint, for later loads), it
    stays; where it asks ``scratch(beside)`` for a scratch folder instead, that folder is removed once every rank
    has read the form, or, where the block fails, once every rank has left it (else it is left, named after this
    process, for a later conversion there to remove when the process is gone). Every rank checks that all see the
    form's file ``seen`` (``check_seen``, with ``what`` and ``by_hand``). Called on every rank together."""
    scratch: list[Path] = []

    def in_scratch(beside: Path) -> Path:
        scratch.append(new_scratch(beside))
        return scratch[-1]

    def on_zero() -> tuple[Path, str, bool]:
        form, how = make(in_scratch)
        return form, how, bool(scratch)

    try:
        form, how, scratched = on_rank_zero(strategy, on_zero, failure)
        check_seen(strategy, Path(form) / seen, what, by_hand)
    except BaseException:
        _remove(scratch)  # every rank ends here together: none reads it
        raise
    try:
        yield Path(form), how
    except BaseException:
        if scratched and every_rank_left("load") and strategy.is_global_zero:  # every rank decides alike
            _remove(scratch)
        raise
    strategy.barrier()  # every rank has read it before rank 0 removes it
    _remove(scratch)


def _remove(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
