"""Shared fixtures for the colossalai-gemini tests (the gpu/tpu markers come from core's pytest plugin)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from lightning_strategies.testing import free_port


@pytest.fixture
def gloo_world_of_one():
    """A real one-process gloo group: GeminiPlugin builds its process-group mesh from it."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
