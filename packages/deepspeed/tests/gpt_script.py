"""A small GPT trained with a DeepSpeed strategy name on GPUs (used by test_gpu.py)."""

from __future__ import annotations

import argparse
import json
import math

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, Dataset


class Tokens(Dataset):
    def __init__(self, vocabulary: int, length: int, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        # A learnable pattern: each next token is the previous plus one.
        starts = torch.randint(0, vocabulary, (count, 1), generator=generator)
        self.data = (starts + torch.arange(length + 1)) % vocabulary

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


class TinyGPT(LightningModule):
    def __init__(self, vocabulary: int = 256, width: int = 128, layers: int = 2, heads: int = 4, length: int = 64,
                 config_optimizer: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.length = length
        self.config_optimizer = config_optimizer
        self.embedding = torch.nn.Embedding(vocabulary, width)
        self.position = torch.nn.Embedding(length, width)
        layer = torch.nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(width, vocabulary)
        self.losses: list[float] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        hidden = self.embedding(tokens) + self.position(positions)
        return self.head(self.blocks(hidden, mask=mask, is_causal=True))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        if self.config_optimizer:
            return None  # the DeepSpeed config's optimizer is used
        if self.trainer.strategy.config.get("zero_optimization", {}).get("offload_optimizer"):
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.parameters(), lr=1e-3)
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--nvme-path", default="/tmp")
    parser.add_argument("--config-optimizer", action="store_true", help="FusedAdam from the DeepSpeed config")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save", default=None, help="checkpoint to write after training")
    parser.add_argument("--resume", default=None, help="checkpoint to resume from (Lightning's default weights_only)")
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args()
    seed_everything(0)
    strategy = arguments.strategy
    if strategy.endswith("nvme") or arguments.config_optimizer:
        from lightning_strategies import get_registry

        entry = get_registry().entry(strategy)
        options = dict(entry.init_params)
        if strategy.endswith("nvme"):
            options["nvme_path"] = arguments.nvme_path
        if arguments.config_optimizer:
            options = {
                "config": {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
            }
        strategy = entry.load_class()(**options)
    model = TinyGPT(config_optimizer=arguments.config_optimizer)
    trainer = Trainer(
        accelerator="cuda", devices=arguments.devices, strategy=strategy, precision=arguments.precision,
        max_steps=arguments.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
    )  # fmt: skip
    trainer.fit(model, DataLoader(Tokens(256, 64, 1024), batch_size=8, shuffle=True), ckpt_path=arguments.resume)
    if arguments.save:
        trainer.save_checkpoint(arguments.save)
    if trainer.is_global_zero:
        from deepspeed.accelerator import get_accelerator

        first, last = sum(model.losses[:5]) / 5, sum(model.losses[-5:]) / 5
        assert math.isfinite(last)
        result = {"first_loss": first, "last_loss": last, "deepspeed_accelerator": get_accelerator().device_name(),
                  "config": json.loads(json.dumps(trainer.strategy.config, default=str)),
                  "global_step": trainer.global_step, "steps_run": len(model.losses)}  # fmt: skip
        with open(arguments.out, "w") as file:
            json.dump(result, file)


if __name__ == "__main__":
    main()
