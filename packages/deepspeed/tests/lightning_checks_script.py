"""Lightning's class checks for its DeepSpeed strategy, met by ours: one fresh process, one CPU device.

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
from lightning.pytorch.callbacks import (
    BaseFinetuning,
    GradientAccumulationScheduler,
    ModelSummary,
    StochasticWeightAveraging,
)
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies.testing import record_checks
from lightning_strategies_deepspeed.fabric import DeepSpeedFabricStrategy
from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy


class RecordingSummary(ModelSummary):
    """Lightning's ModelSummary, keeping the numbers it would print."""

    seen: dict[str, Any] = {}

    def _summary(self, trainer: Any, pl_module: Any) -> Any:
        summary = super()._summary(trainer, pl_module)
        RecordingSummary.seen.update(kind=type(summary).__name__, total_parameters=summary.total_parameters)
        return summary


class NoFreezing(BaseFinetuning):
    def freeze_before_training(self, pl_module: Any) -> None:
        pass

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        pass


def fit(callback: Any, stage: int = 2) -> None:
    trainer = Trainer(
        strategy=DeepSpeedStrategy(stage=stage),
        accelerator="cpu",
        devices=1,
        max_steps=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(BoringModel())


def summary_of_zero_3() -> dict[str, Any]:
    fit(RecordingSummary(), stage=3)
    return RecordingSummary.seen


def fabric_backward_with_two_models() -> None:
    fabric = Fabric(strategy=DeepSpeedFabricStrategy(stage=2), accelerator="cpu", devices=1)
    fabric.launch()
    models = [torch.nn.Linear(4, 1) for _ in range(2)]
    set_up = [fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1)) for model in models]
    loss = set_up[0][0](torch.ones(2, 4)).sum()
    fabric.backward(loss)  # Fabric's DeepSpeed branch: which model's engine is ambiguous


def fabric_setup_optimizers_alone() -> None:
    fabric = Fabric(strategy=DeepSpeedFabricStrategy(stage=2), accelerator="cpu", devices=1)
    fabric.launch()
    model = torch.nn.Linear(4, 1)
    fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))


def fabric_sharded_model_under_zero_3() -> dict[str, Any]:
    import warnings

    fabric = Fabric(strategy=DeepSpeedFabricStrategy(stage=3), accelerator="cpu", devices=1)
    fabric.launch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Fabric's deprecation of sharded_model() in favour of init_module()
        with fabric.sharded_model():  # Fabric's _Sharded branch: the strategy's module_sharded_context
            model = torch.nn.Linear(4, 3)
    return {"partitioned": hasattr(model.weight, "ds_numel"), "local_numel": model.weight.numel()}


CHECKS: dict[str, Callable[[], Any]] = {
    "summary_zero_3": summary_of_zero_3,
    "stochastic_weight_averaging": lambda: fit(StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=1)),
    "finetuning": lambda: fit(NoFreezing()),
    "accumulation_scheduler": lambda: fit(GradientAccumulationScheduler(scheduling={1: 2})),
    "fabric_backward_two_models": fabric_backward_with_two_models,
    "fabric_setup_optimizers": fabric_setup_optimizers_alone,
    "fabric_sharded_model_zero_3": fabric_sharded_model_under_zero_3,
}


if __name__ == "__main__":
    record_checks(CHECKS, sys.argv[1])
    end_process_group()  # before exit, so that gloo's threads cannot abort it
