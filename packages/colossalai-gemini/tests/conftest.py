"""Markers and shared fixtures for the colossalai-gemini tests."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs one or more CUDA GPUs")
    config.addinivalue_line("markers", "tpu: needs a TPU")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def gloo_world_of_one():
    """A real one-process gloo group: GeminiPlugin builds its process-group mesh from it."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
