"""Lightning's class checks for its FSDP strategy, met by ours: one fresh process, one CPU device (gloo).

Each check runs Lightning's real Trainer or Fabric with our strategy and records what happened (a value,
or the exception's type and message) in a JSON file that test_lightning_class_checks.py reads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies.testing import QUIET_TRAINER, record_checks
from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy
from lightning_strategies_fsdp.strategy import FSDP2Strategy


def fit(model: Any, callbacks: list[Any] | None = None) -> Trainer:
    trainer = Trainer(
        strategy=FSDP2Strategy(),
        accelerator="cpu",
        devices=1,
        max_steps=2,
        callbacks=callbacks or [],
        **QUIET_TRAINER,
        enable_checkpointing=False,
        limit_val_batches=0,
    )
    trainer.fit(model)
    return trainer


def compiled_model_trains() -> dict[str, Any]:
    model = BoringModel()
    before = model.layer.weight.detach().clone()
    trainer = fit(torch.compile(model, backend="eager"))
    after = model.layer.weight.full_tensor() if hasattr(model.layer.weight, "full_tensor") else model.layer.weight
    return {"global_step": trainer.global_step, "weights_changed": not torch.equal(before, after.detach().cpu())}


def fabric_meta_device_model_with_its_optimizer() -> dict[str, Any]:
    fabric = Fabric(strategy=FSDP2FabricStrategy(), accelerator="cpu", devices=1)
    fabric.launch()
    with fabric.init_module(empty_init=True):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    parameter = next(model.parameters())
    before = parameter.full_tensor().clone()
    fabric.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    return {
        "materialized": not parameter.is_meta,
        "stepped": not torch.equal(before, parameter.full_tensor()),
    }


CHECKS: dict[str, Callable[[], Any]] = {
    "stochastic_weight_averaging": lambda: fit(
        BoringModel(), [StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=1)]
    ),
    "compiled_model": compiled_model_trains,
    "fabric_meta_device_setup": fabric_meta_device_model_with_its_optimizer,
}


if __name__ == "__main__":
    record_checks(CHECKS, sys.argv[1])
    end_process_group()  # before exit, so that gloo's threads cannot abort it
