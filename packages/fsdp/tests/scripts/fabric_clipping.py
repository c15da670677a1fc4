"""fabric.clip_gradients with FSDP2 on two CPU processes; rank 0 writes the norm and the clipped
gradients (full) to OUT. Fabric launches the second process by re-running this command line.

    python fabric_clipping.py OUT
"""

from __future__ import annotations

import sys

import torch
from lightning.fabric import Fabric

from lightning_strategies.conformance.launching import end_process_group


def main() -> None:
    fabric = Fabric(strategy="fsdp", accelerator="cpu", devices=2)
    fabric.launch()
    torch.manual_seed(0)  # the weights of test_clipping.model()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    batch = torch.arange(32, dtype=torch.float32).reshape(4, 8) / 10
    fabric.backward(model(batch).pow(2).sum())
    norm = fabric.clip_gradients(model, optimizer, max_norm=0.5)
    gradients = [parameter.grad.full_tensor() for parameter in model.parameters()]
    if fabric.global_rank == 0:
        torch.save({"norm": norm, "gradients": gradients}, sys.argv[1])


if __name__ == "__main__":
    main()
    end_process_group()  # before exit, so that gloo's threads cannot abort it
