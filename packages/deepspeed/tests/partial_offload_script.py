"""Trains a small model for 2 steps on one CPU process with ZeRO-3 offloading half of the optimizer states,
and writes what DeepSpeed's engine made of the setting (run by test_memory_plan.py)."""

from __future__ import annotations

import json
import sys

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy


class Layers(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(4)))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layers(inputs), targets)

    def configure_optimizers(self):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        # DeepSpeed's partial offload runs CPU Adam on the offloaded share and needs it as the optimizer.
        return DeepSpeedCPUAdam(self.parameters(), lr=0.01)


def main() -> None:
    out, ratio, sub_group_size = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    seed_everything(7)
    strategy = DeepSpeedStrategy(stage=3, offload_optimizer=ratio, sub_group_size=sub_group_size)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = TensorDataset(torch.randn(8, 32), torch.randn(8, 32))
    trainer.fit(Layers(), DataLoader(data, batch_size=4))
    engine = trainer.strategy.model
    optimizer = engine.optimizer
    result = {
        "config_ratio": strategy.config["zero_optimization"]["offload_optimizer"].get("ratio"),
        "engine_ratio": engine.zero_partial_offload(),
        "optimizer_ratio": optimizer.partial_offload,
        "sub_groups": len(optimizer.fp16_partitioned_groups_flat),
        "partial_offload_path": hasattr(optimizer, "backup_optimizer"),
        "steps": trainer.global_step,
    }
    with open(out, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main()
    end_process_group()  # before exit, so that gloo's threads cannot abort it
