"""Fabric with DeepSpeed names on 2 CPU processes: train, save, load into a fresh model, compare.

Between the save and the load, training goes on and a second save to the same path fails half
way: the load must still find the first save, whole. The saved state holds entries named like
DeepSpeed's own (``global_steps``, ``mp_world_size``): both the user's and DeepSpeed's must come back.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch
from lightning.fabric import Fabric

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies.errors import CheckpointError


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


def fit(fabric: Fabric, model, optimizer, steps: int) -> list[float]:
    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)
    losses = []
    for _ in range(steps):  # one batch, fitted repeatedly: its loss must fall
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


def step_without_backward_sync(fabric: Fabric, model, optimizer) -> list[str]:
    """The warnings of one step under fabric.no_backward_sync, which DeepSpeed cannot honour."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fabric.no_backward_sync(model):
            fit(fabric, model, optimizer, steps=1)
    return [str(warning.message) for warning in caught]


def save_failing_half_way(fabric: Fabric, checkpoint: str, state: dict) -> str:
    """fabric.save, with every rank's write raising once its optimizer-state file is written."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    write = TorchCheckpointEngine.save

    def write_then_fail(engine, state_dict, path):
        write(engine, state_dict, path)
        if str(path).endswith("optim_states.pt"):
            raise OSError("injected failure mid-save")

    TorchCheckpointEngine.save = write_then_fail
    try:
        fabric.save(checkpoint, state)
    except OSError as error:
        return str(error)
    finally:
        TorchCheckpointEngine.save = write
    return "the save did not fail"


def run(strategy: str, checkpoint: str, out: str) -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(3)
    model, optimizer = build(fabric)
    no_sync_warnings = step_without_backward_sync(fabric, model, optimizer)
    losses = fit(fabric, model, optimizer, steps=6)
    trained = weights(fabric, model)
    engine_steps = fabric.strategy.model.global_steps
    user_state = {"step": 6, "global_steps": 60, "mp_world_size": 4}
    fabric.save(checkpoint, {"model": model, "optimizer": optimizer, **user_state})
    fit(fabric, model, optimizer, steps=2)
    trained_further = weights(fabric, model)
    failed_save = save_failing_half_way(fabric, checkpoint, {"model": model, "optimizer": optimizer, "step": 8})
    try:  # caught as with Lightning's DeepSpeed strategy, and as this project's CheckpointError
        fabric.load(str(Path(checkpoint).with_name("missing.ckpt")), {"model": model})
        missing = "no error"
    except FileNotFoundError as error:
        missing = str(error) if isinstance(error, CheckpointError) else f"not a CheckpointError: {error}"
    fabric.seed_everything(99)  # a differently initialised model, then restored from the checkpoint
    fresh_model, fresh_optimizer = build(fabric)
    state = {"model": fresh_model, "optimizer": fresh_optimizer, "step": 0, "global_steps": 0, "mp_world_size": 0}
    fabric.load(checkpoint, state)
    restored = weights(fabric, fresh_model)
    if fabric.global_rank == 0:
        with open(out, "w") as file:
            json.dump({"losses": losses, "trained": trained, "restored": restored, "step": state["step"],
                       "trained_further": trained_further, "failed_save": failed_save, "missing": missing,
                       "strategy_class": type(fabric.strategy).__name__, "no_sync_warnings": no_sync_warnings,
                       "user_state": {key: state[key] for key in user_state}, "engine_steps": engine_steps,
                       "restored_engine_steps": fabric.strategy.model.global_steps}, file)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", required=True, help="JSON list of runs, each a strategy name, checkpoint and out")
    arguments = parser.parse_args()
    # One after another in the same 2 processes, each with its own Fabric: every launch pays for importing
    # DeepSpeed and forming the group again.
    for spec in json.loads(arguments.runs):
        run(spec["strategy"], spec["checkpoint"], spec["out"])


if __name__ == "__main__":
    main()
    end_process_group()  # before exit, so that gloo's threads cannot abort it
