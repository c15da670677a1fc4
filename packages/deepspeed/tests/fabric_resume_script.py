"""Fabric: a DeepSpeed checkpoint saved on one number of processes and loaded on another (issue 29, item 1).

``save`` trains 2 x STEPS Adam steps and saves after the first STEPS; ``resume`` loads that checkpoint (on
another number of processes, or saved by another strategy) and trains the last STEPS; ``resume-weights`` loads the
model and the step alone, and trains on with a fresh optimizer. Every rank fits the same batch, so the global batch is
the same at every world size. Rank 0 writes the losses and counters as JSON.
"""

from __future__ import annotations

import argparse
import json

import torch
from lightning.fabric import Fabric

from lightning_strategies.conformance.launching import end_process_group

STEPS = 3


def run(strategy: str, devices: int, mode: str, checkpoint: str, out: str) -> None:
    fabric = Fabric(accelerator="cpu", devices=devices, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(3 if mode == "save" else 99)  # the resumed model starts from other weights
    with fabric.init_module():
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    if mode == "resume":
        fabric.load(checkpoint, state)
    elif mode == "resume-weights":
        weights_and_step = {"model": model, "step": 0}
        fabric.load(checkpoint, weights_and_step)
        state["step"] = weights_and_step["step"]
    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)
    losses = []
    for _ in range(2 * STEPS if mode == "save" else STEPS):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        state["step"] += 1
        if mode == "save" and state["step"] == STEPS:
            fabric.save(checkpoint, state)
    if fabric.global_rank == 0:
        engine_steps = getattr(getattr(fabric.strategy, "model", None), "global_steps", None)  # DeepSpeed's
        with open(out, "w") as file:
            json.dump({"losses": losses, "step": state["step"], "engine_steps": engine_steps}, file)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", required=True, help="JSON list of runs: strategy, devices, mode, checkpoint, out")
    for spec in json.loads(parser.parse_args().runs):  # one after another in the same processes
        run(spec["strategy"], spec["devices"], spec["mode"], spec["checkpoint"], spec["out"])
    end_process_group()  # the runs' engines hold the group's communicators


if __name__ == "__main__":
    main()
