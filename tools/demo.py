"""Train a small character-level transformer by strategy name, on CPU, with nothing to download.

    python tools/demo.py                       # strategy "fsdp" (lightning-strategies-fsdp), 2 processes
    python tools/demo.py --strategy ddp --devices 1

The strategy is chosen by name only: this script imports nothing of lightning-strategies, which
is the point. The text is embedded below so the demo runs offline.
"""

from __future__ import annotations

import argparse
import time

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, Dataset

TEXT = (
    "Training strategies decide where parameters, gradients and optimizer states live, and how "
    "the processes that train a model talk to each other. Data parallel training keeps a full "
    "copy of the model on every device; sharded training splits it, so that models larger than "
    "one device can be trained. A strategy is chosen by name, and the rest of the program stays "
    "the same. "
) * 8


class CharacterWindows(Dataset):
    def __init__(self, text: str, window: int = 32) -> None:
        self.vocabulary = sorted(set(text))
        self.codes = torch.tensor([self.vocabulary.index(character) for character in text])
        self.window = window

    def __len__(self) -> int:
        return (len(self.codes) - 1) // self.window

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.window
        chunk = self.codes[start : start + self.window + 1]
        return chunk[:-1], chunk[1:]


class TinyTransformer(LightningModule):
    def __init__(self, vocabulary_size: int, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(vocabulary_size, width)
        self.position = torch.nn.Parameter(torch.zeros(1, 64, width))
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(width, vocabulary_size)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Logits of every position, one row each: (batch x length, vocabulary)."""
        length = codes.shape[1]
        causal = torch.nn.Transformer.generate_square_subsequent_mask(length, device=codes.device)
        hidden = self.embedding(codes) + self.position[:, :length]
        for block in self.blocks:
            hidden = block(hidden, src_mask=causal, is_causal=True)
        # On 2-D input the head's output is a fresh tensor; on 3-D it is a view of one, which FSDP2
        # warns about (an in-place op on a returned view would skip its all-gather).
        return self.head(hidden.reshape(-1, hidden.shape[-1]))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_index: int) -> torch.Tensor:
        inputs, targets = batch
        loss = torch.nn.functional.cross_entropy(self(inputs), targets.reshape(-1))
        self.log("loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class LossReport(Callback):
    """Prints the epoch's mean loss on rank 0, so the fall is visible in a log without a bar, and
    keeps the first and last step's loss (averaged over the ranks) for the closing summary."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *arguments: object) -> None:
        loss = trainer.callback_metrics.get("loss")
        if loss is not None:
            self.last = float(loss)
            self.first = self.last if self.first is None else self.first

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loss = trainer.callback_metrics.get("loss")
        if trainer.is_global_zero and loss is not None:
            print(f"\nepoch {trainer.current_epoch}: loss {float(loss):.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="fsdp", help="any name `lightning-strategies list` shows")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    arguments = parser.parse_args()

    seed_everything(7, verbose=False)
    dataset = CharacterWindows(TEXT)
    report = LossReport()
    trainer = Trainer(
        strategy=arguments.strategy,
        accelerator="cpu",
        devices=arguments.devices,
        max_epochs=arguments.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[report],
    )
    if trainer.is_global_zero:
        print(
            f"strategy {arguments.strategy!r} -> {type(trainer.strategy).__module__}.{type(trainer.strategy).__name__}"
        )
    started = time.perf_counter()
    trainer.fit(TinyTransformer(len(dataset.vocabulary)), DataLoader(dataset, batch_size=8))
    if trainer.is_global_zero and report.first is not None and report.last is not None:
        print(
            f"demo: strategy {arguments.strategy} on {arguments.devices} x cpu, {trainer.global_step} steps, "
            f"loss {report.first:.3f} -> {report.last:.3f}, {time.perf_counter() - started:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
