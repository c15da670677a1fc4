"""A group of ranks launched after a run in this process gets a rendezvous of its own."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from lightning_strategies.conformance.launching import RENDEZVOUS_VARIABLES, fresh_launch_environment

# What a launched script does: join a group through the environment, choosing a port only if none is set.
CHILD = """
import os, socket, torch.distributed as dist
if "MASTER_PORT" not in os.environ:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(probe.getsockname()[1]))
dist.init_process_group("gloo", rank=0, world_size=1)
dist.destroy_process_group()
"""


@pytest.fixture
def group_of_this_process(monkeypatch: pytest.MonkeyPatch):
    """This process trained first, as a one-GPU test or a notebook cell does: its store holds MASTER_PORT."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_launch_with_this_process_environment_collides(group_of_this_process: None) -> None:
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert child.returncode != 0 and "EADDRINUSE" in child.stderr, child.stderr[-2000:]


def test_a_fresh_launch_environment_starts_a_new_group(group_of_this_process: None) -> None:
    environment = fresh_launch_environment({"EXTRA": "kept"})
    assert not set(RENDEZVOUS_VARIABLES) & set(environment) and environment["EXTRA"] == "kept"
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=environment)
    assert child.returncode == 0, child.stderr[-2000:]
