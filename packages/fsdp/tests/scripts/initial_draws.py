"""What each process holds after set-up of a model built from a config on the host: replicas of one shard must
hold the same values, distinct shards different ones. Rank 0 writes {name: {"replicas_equal", "shards_differ"}}."""

from __future__ import annotations

import json
import sys

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from lightning_strategies.conformance.launching import end_process_group


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net: torch.nn.Module | None = None

    def configure_model(self) -> None:
        if self.net is None:
            self.net = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))

    def on_fit_start(self) -> None:
        local = self.net[0].weight.to_local().detach().clone()
        gathered: list[torch.Tensor] = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, local)
        self.gathered = gathered

    def training_step(self, batch, batch_index):
        return self.net(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return DataLoader(torch.zeros(4, 1, dtype=torch.long), batch_size=1)


results = {}
for name in ("fsdp", "fsdp_no_shard"):
    model = Model()
    trainer = L.Trainer(strategy=name, accelerator="cpu", devices=2, max_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model)
    first, second = model.gathered
    results[name] = {"replicas_equal": torch.equal(first, second), "shards_differ": not torch.equal(first, second)}
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as out:
        json.dump(results, out)
end_process_group()  # before exit, so that gloo's threads cannot abort it
