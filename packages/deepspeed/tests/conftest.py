"""Fixtures for real DeepSpeed runs on CPU: a training program run in fresh processes, and the
plain-PyTorch reference its results must match."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from train_script import flags

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
    command = [HERE / "train_script.py", *flags(strategy=strategy, out=out, strategy_options=options, **arguments)]
    return run_script(*command, env=EXTRA, unset=UNSET, timeout=600, check=check)


def train_together(folder: Path, runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Train ``runs`` (each: train_script.py's options by name, ``strategy`` and ``options`` as for ``run_training``)
    one after another in one launch (2 processes unless they say otherwise); return what rank 0 wrote, by run.

    Each launch costs two interpreters importing torch, Lightning and DeepSpeed and a gloo rendezvous; each run in
    it builds its own model, strategy and Trainer. A run that failed holds ``error`` and ``traceback`` instead.
    """
    folder.mkdir(parents=True, exist_ok=True)
    outs = {key: folder / f"{key}.pt" for key in runs}
    specifications = []
    for key, run in runs.items():
        arguments = {name: value for name, value in run.items() if name != "options"}
        specifications.append({**arguments, "strategy_options": run.get("options"), "out": str(outs[key])})
    command = [HERE / "train_script.py", "--runs", json.dumps(specifications, default=str)]
    launch = run_script(*command, env=EXTRA, unset=UNSET, timeout=900, check=False)
    missing = {"error": f"no result (the launch exited with {launch.returncode})", "traceback": launch.stderr[-6000:]}
    return {key: torch.load(out, weights_only=False) if out.is_file() else missing for key, out in outs.items()}


def succeeded(results: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
    """The result of run ``key`` of a ``train_together`` launch, which must have trained to the end."""
    result = results[key]
    assert "error" not in result, f"run {key}: {result['error']}\n{result['traceback']}"
    return result


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


class OneProcess:
    """What rank 0's work on a checkpoint (core's on_rank_zero, form_for_the_load) asks of a strategy, for one process
    that resumes what two saved."""

    world_size = num_processes = 1
    is_global_zero = True

    def broadcast(self, obj: Any) -> Any:
        return obj

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision

    def barrier(self) -> None:
        pass
