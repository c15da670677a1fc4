"""A tiny GPT-like LightningModule and data for the GPU tests, built in configure_model."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

VOCAB, WIDTH, LENGTH = 512, 128, 64


class Tokens(Dataset):
    """Counting sequences from random starts: each next token is the previous plus one, a pattern the model
    learns within a few steps (random tokens hold nothing to learn, so a test of learning on them is a coin toss)."""

    def __init__(self, count: int = 64, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB, (count, 1), generator=generator)
        self.data = (starts + torch.arange(LENGTH + 1)) % VOCAB

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


class TinyGPT(L.LightningModule):
    def __init__(self, optimizer: str = "hybrid", lr: float = 1e-3) -> None:
        super().__init__()
        self.optimizer_name = optimizer
        self.lr = lr
        self.net = None
        self.losses: list[float] = []

    def configure_model(self) -> None:
        if self.net is not None:
            return
        torch.manual_seed(0)  # the same weights whichever test ran before, so "it learns" is deterministic
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.net = torch.nn.ModuleDict(
            {
                "embed": torch.nn.Embedding(VOCAB, WIDTH),
                "blocks": torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                "head": torch.nn.Linear(WIDTH, VOCAB),
            }
        )

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        hidden = self.net["blocks"](self.net["embed"](inputs))
        logits = self.net["head"](hidden).float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.losses.append(float(loss.detach()))
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch), sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self.loss(batch), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.loss(batch).float().cpu()

    def configure_optimizers(self):
        from colossalai.nn.optimizer import CPUAdam, HybridAdam

        if self.optimizer_name == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=self.lr)
        if self.optimizer_name == "adam":  # HybridAdam's own update (it has no weight decay by default)
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        optimizer_class = CPUAdam if self.optimizer_name == "cpu" else HybridAdam
        return optimizer_class(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        # 64 sequences on one or two GPUs (8 or 4 batches per rank), 32 per rank beyond: the several-GPU runs'
        # epochs of 3 batches need at least 3 batches on every rank.
        return DataLoader(Tokens(max(64, 32 * self.trainer.world_size)), batch_size=8)

    def val_dataloader(self):
        return DataLoader(Tokens(16, seed=1), batch_size=8)

    test_dataloader = val_dataloader
    predict_dataloader = val_dataloader
