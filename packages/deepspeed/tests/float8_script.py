"""A Hugging Face Llama read with from_pretrained and converted to torchao's float8 training in configure_model (as
a user opts in), trained six steps under ``ddp`` and then under ``deepspeed_stage_3`` on two CPU processes, from the
same weights and batches. Rank 0 writes {strategy: losses} as JSON to OUT.

    python float8_script.py PRETRAINED_FOLDER OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
import transformers
from torch.utils.data import DataLoader

STEPS = 6


class Float8Llama(L.LightningModule):
    def __init__(self, pretrained: Path) -> None:
        super().__init__()
        self.pretrained = pretrained
        self.model: torch.nn.Module | None = None
        self.losses: list[float] = []

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from torchao.float8 import convert_to_float8_training

        self.model = transformers.AutoModelForCausalLM.from_pretrained(self.pretrained)
        convert_to_float8_training(self.model.model)  # the decoder layers; the head stays

    def training_step(self, batch: torch.Tensor, batch_index: int) -> torch.Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader((torch.arange(32) * 3 % 128).repeat(64, 1), batch_size=4)


def main(pretrained: Path, out: Path) -> None:
    losses = {}
    for strategy in ("ddp", "deepspeed_stage_3"):
        trainer = L.Trainer(
            strategy=strategy, accelerator="cpu", devices=2, max_steps=STEPS, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        model = Float8Llama(pretrained)
        trainer.fit(model)
        losses[strategy] = model.losses
    if torch.distributed.get_rank() == 0:
        out.write_text(json.dumps(losses))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
