"""Fixtures for real DeepSpeed runs on CPU: a training program run in fresh processes, and the
plain-PyTorch reference its results must match."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_strategies.conformance.launching import fresh_launch_environment
from lightning_strategies.testing import run_script

HERE = Path(__file__).parent
PACKAGE = HERE.parent
# JIT-built DeepSpeed ops (CPUAdam, async I/O) are built once and reused by every run.
EXTENSIONS_DIR = Path(os.environ.get("TORCH_EXTENSIONS_DIR", PACKAGE / ".cache" / "torch_extensions")).resolve()
# What launched runs get: the shared extensions folder, and not DeepSpeed's accelerator switch (the strategy
# must choose the accelerator itself).
EXTRA = {"TORCH_EXTENSIONS_DIR": str(EXTENSIONS_DIR)}
UNSET = ("DS_ACCELERATOR",)


def clean_environment() -> dict[str, str]:
    """A fresh launch environment minus DeepSpeed's accelerator switch, with the shared extensions folder."""
    environment = fresh_launch_environment(EXTRA)
    for name in UNSET:
        environment.pop(name, None)
    return environment


def run_training(
    out: Path,
    strategy: str = "deepspeed",
    options: dict[str, Any] | None = None,
    check: bool = False,
    **arguments: Any,
) -> subprocess.CompletedProcess[str]:
    """Run tests/train_script.py (2 processes on CPU by default); rank 0 writes its results to ``out``."""
    command: list[str | Path] = [HERE / "train_script.py", "--strategy", strategy, "--out", out]
    if options:
        command += ["--strategy-options", json.dumps(options)]
    for name, value in arguments.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is not None and value is not False:
            command += [flag, str(value)]
    return run_script(*command, env=EXTRA, unset=UNSET, timeout=600, check=check)


@pytest.fixture
def train(tmp_path: Path):
    """Train with tests/train_script.py and return what rank 0 wrote; the run must succeed."""
    counter = iter(range(100))

    def run(strategy: str = "deepspeed", options: dict[str, Any] | None = None, **arguments: Any) -> dict[str, Any]:
        out = tmp_path / f"result-{next(counter)}.pt"
        run_training(out, strategy, options, check=True, **arguments)
        return torch.load(out, weights_only=False)

    return run


def reference_weights(
    max_steps: int,
    batch_size: int = 4,
    batches: int = 16,
    accumulate: int = 1,
    clip: float | None = None,
    optimizer: str = "sgd",
    learning_rate: float = 0.05,
) -> dict[str, torch.Tensor]:
    """The same training in one process with plain PyTorch: what every data-parallel run must reproduce."""
    sys.path.insert(0, str(HERE))
    from lightning.pytorch import seed_everything
    from train_script import Regression, data

    seed_everything(7, workers=True)
    model = Regression(optimizer)
    torch_optimizer = (
        torch.optim.SGD(model.parameters(), lr=learning_rate)
        if optimizer == "sgd"
        else torch.optim.Adam(model.parameters(), lr=learning_rate)
    )
    steps = 0
    while steps < max_steps:
        for index, (inputs, targets) in enumerate(data(batch_size, batches)):
            loss = torch.nn.functional.mse_loss(model.net(inputs), targets) / accumulate
            loss.backward()
            if (index + 1) % accumulate == 0:
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                torch_optimizer.step()
                torch_optimizer.zero_grad()
                steps += 1
                if steps == max_steps:
                    break
    return {name: tensor.detach().clone() for name, tensor in model.named_parameters()}


def assert_weights_close(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], tolerance: float = 1e-5
) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=tolerance, rtol=tolerance, msg=name)


def assert_weights_differ(actual: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> None:
    assert any(not torch.allclose(actual[name], other[name], atol=1e-6) for name in other)
