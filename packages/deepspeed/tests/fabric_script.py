"""Fabric with a DeepSpeed name on 2 CPU processes: train, save, load into a fresh model, compare."""

from __future__ import annotations

import argparse
import json

import torch
from lightning.fabric import Fabric


def build(fabric: Fabric):
    with fabric.init_module():
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return fabric.setup(model, optimizer)


def weights(fabric: Fabric, model) -> dict[str, list]:
    module = fabric.strategy.model.module
    parameters = list(module.parameters())
    if fabric.strategy.zero_stage_3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(parameters):
            return {name: tensor.detach().float().flatten().tolist() for name, tensor in module.named_parameters()}
    return {name: tensor.detach().float().flatten().tolist() for name, tensor in module.named_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="deepspeed_stage_2")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy=arguments.strategy)
    fabric.launch()
    fabric.seed_everything(3)
    model, optimizer = build(fabric)
    generator = torch.Generator().manual_seed(0)
    losses = []
    inputs, targets = torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)
    for _ in range(6):  # one batch, fitted repeatedly: its loss must fall
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    trained = weights(fabric, model)
    fabric.save(arguments.checkpoint, {"model": model, "optimizer": optimizer, "step": 6})
    fabric.seed_everything(99)  # a differently initialised model, then restored from the checkpoint
    fresh_model, fresh_optimizer = build(fabric)
    state = {"model": fresh_model, "optimizer": fresh_optimizer, "step": 0}
    fabric.load(arguments.checkpoint, state)
    restored = weights(fabric, fresh_model)
    if fabric.global_rank == 0:
        with open(arguments.out, "w") as file:
            json.dump({"losses": losses, "trained": trained, "restored": restored, "step": state["step"],
                       "strategy_class": type(fabric.strategy).__name__}, file)  # fmt: skip


if __name__ == "__main__":
    main()
