"""The tiny model and data the conformance suite trains: small enough for CPU, with enough
structure (two linear layers) for a sharding strategy to have something to shard."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from lightning_strategies.entries import import_target

FEATURES = 16
SAMPLES = 64
BATCH_SIZE = 8


def regression_data(seed: int = 1234) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    weights = torch.randn(FEATURES, 1, generator=generator)
    return TensorDataset(inputs, inputs @ weights + 0.1 * torch.randn(SAMPLES, 1, generator=generator))


def loader(dataset: TensorDataset | None = None) -> DataLoader:
    # No shuffling: an interrupted and an uninterrupted run must see batches in the same order.
    return DataLoader(dataset or regression_data(), batch_size=BATCH_SIZE, shuffle=False)


class ConformanceModel(LightningModule):
    """Regression with a two-layer MLP; records what the suite asserts on."""

    def __init__(self, optimizer: str = "torch.optim:Adam", learning_rate: float = 0.01) -> None:
        super().__init__()
        self.optimizer_target = optimizer
        self.learning_rate = learning_rate
        self.layers = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        self.train_losses: list[float] = []
        self.stages_run: set[str] = set()

    @override
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)

    def _loss(self, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self(inputs).float(), targets.float())

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.train_losses.append(float(loss.detach()))
        self.stages_run.add("fit")
        return loss

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.stages_run.add("validate")
        self.log("val_loss", self._loss(batch), sync_dist=True)

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.stages_run.add("test")
        self.log("test_loss", self._loss(batch), sync_dist=True)

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.stages_run.add("predict")
        return self(batch[0]).float()

    @override
    def configure_optimizers(self) -> Any:
        optimizer_class = import_target(self.optimizer_target)
        return optimizer_class(self.parameters(), lr=self.learning_rate)
