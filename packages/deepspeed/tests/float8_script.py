"""A Hugging Face Llama read with from_pretrained and converted to torchao's float8 training in configure_model (as
a user opts in), trained six steps under ``ddp`` and then under ``deepspeed_stage_3`` on two CPU processes, from the
same weights and batches. Rank 0 writes {strategy: {"losses", "float8_layers", "partitioned"}} as JSON to OUT:
at the first step, how many float8 layers the model has, and whether ZeRO-3 holds each of their weights as a
partition (a ``ds_id``, and a local part smaller than the whole).

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

from lightning_strategies.conformance.launching import end_process_group

STEPS = 6


class Float8Llama(L.LightningModule):
    def __init__(self, pretrained: Path) -> None:
        super().__init__()
        self.pretrained = pretrained
        self.model: torch.nn.Module | None = None
        self.losses: list[float] = []
        self.float8_layers = 0
        self.partitioned = False

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from torchao.float8 import convert_to_float8_training

        self.model = transformers.AutoModelForCausalLM.from_pretrained(self.pretrained)
        convert_to_float8_training(self.model.model)  # the decoder layers; the head stays

    def training_step(self, batch: torch.Tensor, batch_index: int) -> torch.Tensor:
        if batch_index == 0:
            from torchao.float8.float8_linear import Float8Linear

            weights = [module.weight for module in self.model.modules() if isinstance(module, Float8Linear)]
            self.float8_layers = len(weights)
            self.partitioned = all(
                hasattr(weight, "ds_id") and 0 < weight.ds_tensor.numel() < weight.ds_numel for weight in weights
            )
        loss = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader((torch.arange(32) * 3 % 128).repeat(64, 1), batch_size=4)


def main(pretrained: Path, out: Path) -> None:
    results = {}
    for strategy in ("ddp", "deepspeed_stage_3"):
        trainer = L.Trainer(
            strategy=strategy, accelerator="cpu", devices=2, max_steps=STEPS, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        model = Float8Llama(pretrained)
        trainer.fit(model)
        results[strategy] = {
            "losses": model.losses, "float8_layers": model.float8_layers, "partitioned": model.partitioned
        }  # fmt: skip
    if torch.distributed.get_rank() == 0:
        out.write_text(json.dumps(results))
    end_process_group()  # the engine holds the group's communicators


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
