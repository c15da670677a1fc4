"""Changes to ``os.environ`` that a strategy makes for one run, undone when the run ends.

Strategies set variables their backend reads (DeepSpeed's accelerator, torch's folder for JIT-built
ops, the ranks DeepSpeed's engine asks for), and a backend's import may set its own (colossalai sets
``CUDA_DEVICE_MAX_CONNECTIONS``). Left set, they would outlive the Trainer and reach whatever the
process does next: another Trainer, a subprocess, another extension's build. Lightning's own
variables (the rendezvous its launcher sets) are Lightning's to keep and are not recorded here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["EnvironmentChanges"]


class EnvironmentChanges:
    """Records what each variable was before the first change, and puts it back on ``restore``."""

    def __init__(self) -> None:
        self._before: dict[str, str | None] = {}
        self._left: dict[str, str | None] = {}  # the value our last change left

    def set(self, name: str, value: str) -> None:
        self._before.setdefault(name, os.environ.get(name))
        os.environ[name] = value
        self._left[name] = value

    def update(self, values: Mapping[str, str]) -> None:
        for name, value in values.items():
            self.set(name, value)

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record whatever the block changes in ``os.environ`` (a backend's import, say) as a change of ours."""
        before = dict(os.environ)
        try:
            yield
        finally:
            for name in before.keys() | os.environ.keys():
                if before.get(name) != os.environ.get(name):
                    self._before.setdefault(name, before.get(name))
                    self._left[name] = os.environ.get(name)

    def restore(self) -> None:
        """Put every recorded variable back as it was; one changed since by someone else keeps their value."""
        for name, before in self._before.items():
            if os.environ.get(name) != self._left[name]:
                continue
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before
        self._before.clear()
        self._left.clear()
