"""One rank fails, every rank ends, and the failed rank is named.

A rank that raises or dies leaves the others blocked inside a collective (an all-reduce in
backward, a barrier around a save) until the process group times out, 30 minutes by default;
usually a scheduler kills the job first, with no word on which rank failed. So every rank of a
strategy from this project runs a watchdog thread that talks through the rendezvous store the
ranks already share:

- a rank that raises records itself under ``failed`` (from the Trainer's ``on_exception``, or
  at exit for an uncaught exception, which covers Fabric); the others see it within a poll;
- a rank that dies without a word (SIGKILL, the out-of-memory killer) stops beating. Each rank
  watches the next one only, so the store serves O(world size) requests per poll, and records
  it once ``timeout`` seconds pass without a beat, or at once when it ran on the same host and
  its process is gone;
- a rank that exits normally says so and is no longer watched.

Exit codes: a rank that raised exits with its own error (1), even when another rank failed first
with the same error; a rank ended because another one failed exits with ``EXIT_CODE`` (70) and
names that rank, once.

A blocked rank's main thread is inside C++ where Python cannot interrupt it, so the watchdog
prints the reason and ends the process with ``os._exit``.

The atexit handler also destroys the default process group while the interpreter is whole:
left to interpreter shutdown, gloo's worker threads can abort a finished, successful process
("terminate called without an active exception").
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = [
    "ReportFailuresMixin",
    "watch_ranks",
]

TIMEOUT_VARIABLE = "LIGHTNING_STRATEGIES_FAILED_RANK_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
EXIT_CODE = 70  # distinct from 1 (an exception on this rank): "ended because another rank failed"
_ACKNOWLEDGE_WAIT = 5.0  # how long rank 0, which hosts the store, waits for the others to read a failure


def failed_rank_timeout() -> float:
    """Seconds without a heartbeat before a silent rank counts as dead; 0 turns the watchdog off."""
    text = os.environ.get(TIMEOUT_VARIABLE, str(DEFAULT_TIMEOUT))
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"{TIMEOUT_VARIABLE}={text!r} is not a number of seconds; set e.g. {TIMEOUT_VARIABLE}=60."
        ) from None
    if value < 0:
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r} is negative; use 0 to turn the failed-rank watchdog off.")
    return value


def watch_ranks(global_rank: int, world_size: int) -> None:
    """Start the watchdog (once per process group) and release the group at exit.

    Strategies call this right after joining the default process group.
    """
    global _watchdog
    if not dist.is_available() or not dist.is_initialized():
        return
    _register_exit_handler()
    timeout = failed_rank_timeout()
    if world_size < 2 or timeout == 0:
        return
    if _watchdog is not None and _watchdog.group is dist.group.WORLD and _watchdog.thread.is_alive():
        return
    _watchdog = _Watchdog(global_rank, world_size, timeout, _store())
    _watchdog.start()


def report_failure(exception: BaseException) -> None:
    """Tell the other ranks that this one failed with ``exception`` (once; later calls are no-ops)."""
    if _watchdog is None or _watchdog.stopped.is_set():
        return
    # If the store went with rank 0, there is nobody left to tell: the user's own error must go
    # on unmasked by one from here.
    with contextlib.suppress(Exception):
        _report(_watchdog, exception, "raised")


def _report(watchdog: _Watchdog, exception: BaseException, how: str) -> bool:
    """Record ``exception`` as this rank's failure, unless it echoes another rank's: True then."""
    if isinstance(exception, KeyboardInterrupt | SystemExit):
        return False  # an interrupt reaches every rank of a run; no rank is to blame
    if watchdog.echoed:
        return True  # reported from on_exception already, now again at exit
    if watchdog.own_failure is not None:
        return False
    # Only a communication error can be the echo of a peer that died or failed: let the watchdog
    # name that peer first. Any other error is this rank's own, even when another rank failed
    # too (the same deterministic error on every rank): it is reported as such and exits 1.
    if _looks_like_communication_error(exception):
        recorded = watchdog.failure()
        if recorded is None and watchdog.wait_for_failure(watchdog.timeout):
            recorded = watchdog.failure()
        if recorded is not None and not recorded.startswith(f"rank {watchdog.rank} "):
            watchdog.acknowledge()
            watchdog.echoed = True
            watchdog.say_once(f"the error below follows this failure: {_sentence(recorded)}")
            return True
    first_line = (str(exception).strip().splitlines() or [""])[0]
    summary = type(exception).__name__ + (f": {first_line}" if first_line else "")
    if not watchdog.claim_own_failure(f"rank {watchdog.rank} {how} {summary}"):
        return False  # too late: the watchdog thread is ending this rank for another's failure
    watchdog.declare()
    watchdog.wait_for_acknowledgements()
    return False


@dataclass
class _Watchdog:
    rank: int
    world_size: int
    timeout: float
    store: dist.Store
    group: object = field(default_factory=lambda: dist.group.WORLD)
    stopped: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.interval = min(1.0, self.timeout / 10)
        self.known_failure: str | None = None  # the first failure any rank recorded
        self.own_failure: str | None = None  # this rank's own, once it reported one
        self.echoed = False  # this rank's error followed another's failure, and said so
        self._said = False  # whether this rank has explained its end; it does so once
        self._saying = threading.Lock()  # held by the main thread or the watchdog thread, never both
        self.thread = threading.Thread(target=self._run, name="lightning-strategies-watchdog", daemon=True)
        self.store.set(f"process/{self.rank}", f"{socket.gethostname()} {os.getpid()}")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=2 * self.interval)

    # -- shared records ----------------------------------------------------------------------

    def claim_own_failure(self, message: str) -> bool:
        """Mark this rank as failing with its own error, unless the watchdog thread is already
        ending it for another rank's failure: False then."""
        with self._saying:
            if self._said:
                return False
            self.own_failure = message
            return True

    def declare(self) -> None:
        """Record this rank's own failure. The first record is the one the other ranks name; a
        rank that fails after it has read it already, so it counts as acknowledged."""
        assert self.own_failure is not None
        if self.store.add("failures", 1) == 1:
            self.store.set("failed", self.own_failure)
            self.known_failure = self.own_failure
        else:
            self.acknowledge()

    def say_once(self, message: str) -> bool:
        """Print ``message`` unless this rank has explained its end already: True if printed."""
        with self._saying:
            if self._said:
                return False
            self._said = True
        _say(self.rank, message)
        return True

    def failure(self) -> str | None:
        if self.known_failure is None and self.store.check(["failed"]):
            self.known_failure = self.store.get("failed").decode()
        return self.known_failure

    def wait_for_failure(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if self.failure() is not None:
                    return True
            except Exception:
                return False
            time.sleep(self.interval)
        return False

    def acknowledge(self) -> None:
        self.store.add("acknowledged", 1)

    def wait_for_acknowledgements(self) -> None:
        # Rank 0 hosts the store: leaving at once would take the failure record with it.
        if self.rank != 0:
            return
        # Everyone but the failed rank reads the record; rank 0 counts itself when it read it.
        deadline = time.monotonic() + _ACKNOWLEDGE_WAIT
        while time.monotonic() < deadline and self.store.add("acknowledged", 0) < self.world_size - 1:
            time.sleep(self.interval / 4)

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        neighbour = _Neighbour(self)
        unreachable_since: float | None = None
        graced = False
        while not self.stopped.wait(self.interval):
            try:
                self.store.add(f"beat/{self.rank}", 1)
                failure = recorded = self.failure()
                if failure is None and self.store.check(["exited/0"]):
                    return  # rank 0 finished normally and its store goes with it
                if failure is None:
                    failure = neighbour.check()
                unreachable_since = None
            except Exception as error:  # the store lives in rank 0's process
                unreachable_since = unreachable_since or time.monotonic()
                if self.own_failure is not None:
                    self._end(self.own_failure, exit_code=1)  # rank 0 has left after reading it
                if self.known_failure is not None:
                    self._end(self.known_failure)  # rank 0 has already left after it
                if time.monotonic() - unreachable_since < self.timeout:
                    continue
                failure = f"rank 0, which hosts the rendezvous store, stopped answering ({error}): it has likely died"
                recorded = None
            if failure is None or failure.startswith(f"rank {self.rank} ") or self.own_failure or self.echoed:
                continue  # this rank's own error, or its echo, is on its way out through the main thread
            # The same deterministic error often reaches every rank within moments of the first:
            # one poll's grace lets this rank's own error arrive, so that it exits as a rank that
            # raised (1), not as one ended for another's failure (70), whichever rank recorded
            # first. A rank found dead gets no grace: nothing is on its way.
            if recorded is not None and not graced:
                graced = True
                continue
            self._end(failure, unless_failing_itself=True)

    def _end(self, failure: str, exit_code: int = EXIT_CODE, unless_failing_itself: bool = False) -> None:
        with self._saying:
            if unless_failing_itself and (self.own_failure is not None or self.echoed):
                return  # the main thread is on its way out with this rank's own error
            already_said, self._said = self._said, True
        try:
            self.acknowledge()
            self.wait_for_acknowledgements()
        except Exception:
            pass
        if already_said:
            os._exit(exit_code)
        _say(
            self.rank,
            f"{_sentence(failure)} Ending rank {self.rank} now instead of waiting in a collective until the process "
            f"group times out ({TIMEOUT_VARIABLE}={self.timeout:g} s bounds how long a silent rank is waited for; "
            "0 turns this watchdog off).",
        )
        os._exit(exit_code)


class _Neighbour:
    """The next rank that has not exited normally, and when it last showed a sign of life."""

    def __init__(self, watchdog: _Watchdog) -> None:
        self.watchdog = watchdog
        self.follow((watchdog.rank + 1) % watchdog.world_size)

    def follow(self, rank: int) -> None:
        self.rank = rank
        self.beats = -1
        self.last_sign = time.monotonic()
        self.process: tuple[str, int] | None = None

    def check(self) -> str | None:
        store = self.watchdog.store
        while store.check([f"exited/{self.rank}"]):
            self.follow((self.rank + 1) % self.watchdog.world_size)
            if self.rank == self.watchdog.rank:
                return None  # every other rank finished normally
        beats = store.add(f"beat/{self.rank}", 0)
        now = time.monotonic()
        if beats != self.beats:
            self.beats, self.last_sign = beats, now
        if self.process is None and store.check([f"process/{self.rank}"]):
            host, pid = store.get(f"process/{self.rank}").decode().split()
            self.process = (host, int(pid))
        if self.process is not None and self.process[0] == socket.gethostname() and not _alive(self.process[1]):
            return f"rank {self.rank} (process {self.process[1]}) is gone: killed by a signal or out of memory"
        silent = now - self.last_sign
        if silent > self.watchdog.timeout:
            return f"rank {self.rank} stopped responding: no heartbeat for {silent:.0f} s (killed, or stuck)"
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc (not Linux): rely on the heartbeat


def _say(rank: int, message: str) -> None:
    print(f"[rank {rank}] lightning-strategies: {message}", file=sys.stderr, flush=True)


def _sentence(text: str) -> str:
    """``text`` ending in one full stop, whether or not the user's error message had one."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _looks_like_communication_error(exception: BaseException) -> bool:
    if isinstance(exception, getattr(torch.distributed, "DistError", ())):
        return True
    text = str(exception)
    return any(marker in text for marker in ("Connection closed by peer", "Connection reset by peer", "NCCL", "gloo"))


def _store() -> dist.Store:
    from torch.distributed.distributed_c10d import _get_default_store

    return dist.PrefixStore("lightning_strategies/watchdog/", _get_default_store())


_watchdog: _Watchdog | None = None
_exit_handler_registered = False


def _register_exit_handler() -> None:
    global _exit_handler_registered
    if not _exit_handler_registered:
        atexit.register(_at_exit)
        _exit_handler_registered = True


def _at_exit() -> None:
    watchdog = _watchdog
    uncaught = getattr(sys, "last_value", None)  # set by the interpreter for an exception nobody caught
    echo = False
    if watchdog is not None and not watchdog.stopped.is_set():
        try:
            if uncaught is not None:
                echo = _report(watchdog, uncaught, "exited with an uncaught")
            else:
                watchdog.store.set(f"exited/{watchdog.rank}", "1")
        except Exception:
            pass  # the store went with rank 0; nothing is left to tell
        watchdog.stop()
    if echo:
        # This rank's error followed another rank's failure: end with the code of a rank the
        # watchdog ends, whichever of the two noticed first. The error is printed by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_CODE)
    if uncaught is None and dist.is_available() and dist.is_initialized():
        # Only after a clean run: destroying a group whose peers failed can block (NCCL).
        dist.destroy_process_group()


class ReportFailuresMixin:
    """For Trainer strategies: report an exception to the other ranks before Lightning's teardown,
    which may itself wait in a collective."""

    def on_exception(self, exception: BaseException) -> None:
        report_failure(exception)
        super().on_exception(exception)  # type: ignore[misc]
