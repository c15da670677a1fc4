"""PJRT's CPU device stands in for a TPU in the cpu tier; the tpu tier runs on a TPU VM."""

import os

import pytest

ON_TPU_TIER = os.environ.get("PJRT_DEVICE", "").upper() == "TPU"
if not ON_TPU_TIER:
    # Before torch_xla is imported anywhere: one PJRT CPU device (several hang in collectives on 2 cores).
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "tpu: needs a TPU VM (PJRT_DEVICE=TPU)")


@pytest.fixture(autouse=True)
def _activated():
    import lightning_strategies

    lightning_strategies.activate()
