"""Work on a checkpoint that global rank 0 does for every rank: converting another layout, reading what a file holds.

Every rank calls ``on_rank_zero`` together. Rank 0 runs the work; the others wait for its answer in a broadcast, so
no rank leaves the collective because it sees the checkpoint otherwise (a node without the shared file system sees
nothing), and a failure on rank 0 ends every rank with the same ``CheckpointError`` instead of leaving the others
waiting for it forever. What rank 0 wrote, every rank then checks that all of them see (``check_seen``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

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
