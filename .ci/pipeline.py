"""Run the nox sessions a selection picks (``-t cpu``), one after another as ``nox -t cpu`` does, but install each
session while the previous session's tests run.

    python3 .ci/pipeline.py -t cpu

A session's installation is ``nox -s NAME --install-only``: its environment, its packages and what its ``prepare``
scripts build (DeepSpeed's JIT-built ops); its tests are ``nox -s NAME -R``, which reuses that environment and
installs nothing. Installing takes a third of CI's time when it waits its turn (the xla session's torch alone is
4.4 GB; DeepSpeed's ops take four minutes of two cores) while the tests leave the cores idle half of the time,
waiting for the processes they launch to import torch and rendezvous. An installation runs in the background at
most AHEAD sessions ahead of the tests, so that the disk holds at most AHEAD + 1 environments (the xla one is 7 GB).

The sessions, their order and their commands are nox's; only when each session installs changes. A session whose
installation fails is reported as failed, with its log, and the others go on; the exit status is 1 if any failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AHEAD = 2
DISCARD = "LIGHTNING_STRATEGIES_DISCARD_ENVS"  # noxfile.py: "1" deletes each environment after its session


def nox(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "nox", *arguments]


def selected_sessions(selection: list[str]) -> list[str]:
    listing = subprocess.run(nox(*selection, "--list", "--json"), cwd=ROOT, capture_output=True, text=True)
    if listing.returncode != 0:
        raise SystemExit(f"nox {' '.join(selection)} --list failed:\n{listing.stdout}{listing.stderr}")
    return [entry["session"] for entry in json.loads(listing.stdout)]


class Installer(threading.Thread):
    """Installs the sessions in order, each once a slot is free (the tests of an earlier one have ended)."""

    def __init__(self, sessions: list[str], logs: Path) -> None:
        super().__init__(daemon=True)
        self.sessions = sessions
        self.logs = logs
        self.slots = threading.Semaphore(AHEAD + 1)
        self.finished = {name: threading.Event() for name in sessions}
        self.results: dict[str, tuple[int, float, Path]] = {}
        self.process: subprocess.Popen[bytes] | None = None

    def run(self) -> None:
        # Installations keep an environment whatever happens next, unless they fail (noxfile.py).
        env = {**os.environ, DISCARD: "on-failure" if os.environ.get(DISCARD) == "1" else "0"}
        for name in self.sessions:
            self.slots.acquire()
            log = self.logs / f"{name}.log"
            started = time.monotonic()
            command = nox("-s", name, "--install-only")
            with log.open("wb") as out:
                self.process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
                code = self.process.wait()
            self.results[name] = (code, time.monotonic() - started, log)
            self.finished[name].set()


def main(selection: list[str]) -> int:
    sessions = selected_sessions(selection)
    print(f"pipeline > {len(sessions)} sessions, each installed while the previous one's tests run: {sessions}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="nox-installs-") as logs:
        installer = Installer(sessions, Path(logs))
        installer.start()
        try:
            for name in sessions:
                waiting = time.monotonic()
                installer.finished[name].wait()
                waited = time.monotonic() - waiting
                code, install_seconds, log = installer.results[name]
                print(f"pipeline > {name}: installed in {install_seconds:.0f} s; the tests waited {waited:.0f} s")
                sys.stdout.write(log.read_text(errors="replace"))
                sys.stdout.flush()
                test_seconds = 0.0
                if code == 0:
                    started = time.monotonic()
                    code = subprocess.run(nox("-s", name, "-R"), cwd=ROOT).returncode
                    test_seconds = time.monotonic() - started
                else:
                    print(f"pipeline > {name}: the installation failed (exit {code}); its tests did not run")
                installer.slots.release()
                rows.append((name, install_seconds, waited, test_seconds, "ok" if code == 0 else "FAILED"))
        finally:
            if installer.process is not None and installer.process.poll() is None:
                installer.process.terminate()
    print("pipeline > session                              install   waited    tests  result")
    for name, install_seconds, waited, test_seconds, result in rows:
        print(f"pipeline > {name:36} {install_seconds:6.0f} s {waited:6.0f} s {test_seconds:6.0f} s  {result}")
    return 1 if any(row[-1] != "ok" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
