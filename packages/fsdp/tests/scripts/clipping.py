"""Gradient clipping by norm with and without CPU offload: the same norms, the same weights.

Lightning launches the other processes by re-running this command line; how many comes from
FSDP_SCENARIO_DEVICES (scenarios.py). Rank 0 writes OUT/clipping.json.

    python clipping.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_strategies.conformance.launching import end_process_group

sys.path.insert(0, str(Path(__file__).parent))
from scenarios import TinyTransformer, full_weights, loader, trainer

from lightning_strategies_fsdp import clipping

CLIP = 0.05  # far below the tiny model's gradient norm (about 1), so every step clips


def total_norm(module: pl.LightningModule) -> float:
    # torch's get_total_norm fails on CPU-offloaded shards of a CUDA mesh, as its clipping did.
    return float(clipping.total_norm(module.parameters()))


class Norms(Callback):
    """The gradient norm before clipping (Lightning clips after the first hook) and as the optimizer used it
    (the next zero_grad, at the start of the following step, finds the clipped gradients)."""

    def __init__(self) -> None:
        self.before: list[float] = []
        self.after: list[float] = []

    def on_before_optimizer_step(self, trainer: pl.Trainer, module: pl.LightningModule, optimizer: Any) -> None:
        self.before.append(total_norm(module))

    def on_before_zero_grad(self, trainer: pl.Trainer, module: pl.LightningModule, optimizer: Any) -> None:
        if any(param.grad is not None for param in module.parameters()):  # none before the first step
            self.after.append(total_norm(module))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name in ("fsdp", "fsdp_cpu_offload"):
        pl.seed_everything(7)
        module, norms = TinyTransformer(), Norms()
        run = trainer(name, steps=4, gradient_clip_val=CLIP, callbacks=[norms], limit_val_batches=0)
        run.fit(module, loader())
        runs[name] = {"before": norms.before, "after": norms.after, "weights": full_weights(module)}
    plain, offloaded = runs["fsdp"], runs["fsdp_cpu_offload"]
    weights_close = all(
        torch.allclose(plain["weights"][key].cpu(), offloaded["weights"][key].cpu(), rtol=1e-5, atol=1e-6)
        for key in plain["weights"]
    )
    if torch.distributed.get_rank() == 0:
        result = {name: {"before": run["before"], "after": run["after"]} for name, run in runs.items()}
        result.update(clip=CLIP, weights_close=weights_close, backend=torch.distributed.get_backend(),
                      world_size=torch.distributed.get_world_size())  # fmt: skip
        (out / "clipping.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
    end_process_group()  # before exit, so that gloo's threads cannot abort it
