"""The test kit every strategy package's tests share, and plugin authors' too: a free port for a process
group, and a runner for scripts that launch ranks of their own.

The same pieces are fixtures of core's pytest plugin (``free_port``, ``run_script``), loaded wherever
lightning-strategies is installed. Importing this module imports neither torch nor Lightning.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping

from lightning_strategies.conformance.launching import fresh_launch_environment

__all__ = ["OUTPUT_TAIL", "ScriptFailed", "free_port", "run_script"]

# Enough of a failed run's output to show the traceback and what the other ranks said before it.
OUTPUT_TAIL = 6000


class ScriptFailed(AssertionError):
    """A launched script exited non-zero; the message ends with the tail of what it wrote."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a rendezvous (``MASTER_PORT``, ``tcp://``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_script(
    *arguments: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
    timeout: float = 600,
    check: bool = True,
    tail: int = OUTPUT_TAIL,
) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with ``arguments`` (a script and its arguments, or ``-m module ...``, ``-c code``)
    in a fresh process, and return what it wrote.

    The environment is this process's without a previous run's rendezvous (``fresh_launch_environment``),
    plus ``env``, less the variables in ``unset``: ranks the script launches form a new group instead of
    reusing this process's port. With ``check``, a non-zero exit raises ``ScriptFailed`` ending with the
    last ``tail`` characters of stdout and of stderr; without it, the caller inspects the result.
    """
    command = [sys.executable, *map(str, arguments)]
    environment = fresh_launch_environment(env)
    for name in unset:
        environment.pop(name, None)
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)
    if check and completed.returncode != 0:
        raise ScriptFailed(
            f"{' '.join(command)} exited with {completed.returncode}.\n"
            f"--- stdout (last {tail} characters) ---\n{completed.stdout[-tail:]}\n"
            f"--- stderr (last {tail} characters) ---\n{completed.stderr[-tail:]}"
        )
    return completed
