"""The training run behind the several-node and SLURM-requeue checks: every rank runs this module.

``multinode.py`` starts it, under torchrun (one per node) or under SLURM's environment variables
(one per task). It trains the conformance model on CPU or GPU and writes, into ``--report``:

- ``report.rank<R>.json``: the cluster environment Lightning chose, this rank's global, local and
  node rank, the world size, and the global step at the start and at the end of training;
- ``weights.start.pt`` (rank 0): the full weights when training started, after any resume;
- ``weights.saved.pt`` (rank 0): the full weights at the moment the checkpoint was written.

``--save-to PATH`` saves after training with ``trainer.save_checkpoint``. ``--requeue-at-step K``
sends this process SIGUSR1 at global step K, so that Lightning's SLURM signal handler saves its
``hpc`` checkpoint and calls ``scontrol requeue``; the run then stops, as the requeued job would be.
Each rank signals itself at the same step: SLURM signals every task, and a save is a collective
that all ranks must enter from the same point of training (a signal that lands on two ranks at
different steps would pair one rank's save with the other's gradient all-reduce).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from typing_extensions import override

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies.conformance.model import ConformanceModel, loader
from lightning_strategies.conformance.suite import first_optimizer, quiet_lightning, registered_entry
from lightning_strategies.conformance.trainer_arguments import QUIET_TRAINER


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lightning_strategies.conformance.multinode_training")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=1, help="devices (processes) per node")
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--root", required=True, help="the Trainer's default_root_dir (where hpc checkpoints go)")
    parser.add_argument("--report", required=True, help="folder for this run's reports and weights")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--ckpt-path", default=None, help="passed to trainer.fit as it is ('hpc', 'last', a path)")
    parser.add_argument("--save-to", default=None, help="save a checkpoint here once training ends")
    parser.add_argument("--requeue-at-step", type=int, default=None, help="send this process SIGUSR1 at this step")
    return parser.parse_args(argv)


def full_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every parameter whole, on CPU; a collective that every rank must call.

    Sharded parameters are gathered the way their owner stores them: DTensors (FSDP2) through
    ``full_tensor``, ZeRO-3 partitions (DeepSpeed, recognisable by ``ds_id``) through DeepSpeed's
    ``GatheredParameters``, Gemini's chunks (ColossalAI) through its wrapper's ``state_dict``,
    which gathers them on every rank when told ``only_rank_0=False``.
    """
    wrapper: Any = trainer.strategy.model
    if wrapper is not None and "only_rank_0" in inspect.signature(wrapper.state_dict).parameters:
        state = wrapper.state_dict(only_rank_0=False)
        return {
            name: value.detach().float().cpu().clone() for name, value in state.items() if value.is_floating_point()
        }
    module = trainer.lightning_module
    parameters = dict(module.named_parameters())
    if any(hasattr(parameter, "ds_id") for parameter in parameters.values()):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(parameters.values())):
            return {name: parameter.detach().float().cpu().clone() for name, parameter in parameters.items()}
    whole = {}
    for name, parameter in parameters.items():
        tensor = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
        whole[name] = tensor.detach().float().cpu().clone()
    return whole


class Recorder(Callback):
    """Records where training started and, with ``requeue_at_step``, raises the requeue signal there."""

    def __init__(self, report: Path, requeue_at_step: int | None) -> None:
        self.report = report
        self.requeue_at_step = requeue_at_step
        self.facts: dict[str, Any] = {}

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        environment = getattr(trainer.strategy, "cluster_environment", None)  # single-device strategies have none
        ranks = ("global_rank", "local_rank", "node_rank", "world_size", "num_nodes")
        self.facts.update({name: getattr(trainer, name) for name in ranks})
        self.facts.update(cluster_environment=type(environment).__name__, start_step=trainer.global_step)
        save_weights(trainer, self.report / "weights.start.pt")

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if self.requeue_at_step is None or trainer.global_step != self.requeue_at_step:
            return
        # CPython runs the handler before os.kill returns, so Lightning's hpc save happens here.
        os.kill(os.getpid(), signal.SIGUSR1)
        self.facts["requeued_at_step"] = trainer.global_step
        save_weights(trainer, self.report / "weights.saved.pt")
        trainer.should_stop = True  # SLURM ends a requeued job; every rank stops at this same step


def save_weights(trainer: Trainer, path: Path) -> None:
    weights = full_weights(trainer)
    if trainer.is_global_zero:
        torch.save(weights, path)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    quiet_lightning()
    report = Path(arguments.report)
    report.mkdir(parents=True, exist_ok=True)
    entry = registered_entry(arguments.strategy)
    torch.manual_seed(0)
    model = ConformanceModel(optimizer=first_optimizer(entry))
    seed_everything(0, verbose=False)
    recorder = Recorder(report, arguments.requeue_at_step)
    trainer = Trainer(
        strategy=arguments.strategy,
        accelerator=arguments.accelerator,
        precision=training_precision(entry.precisions if entry else None),  # type: ignore[arg-type]  # a flag
        devices=arguments.devices,
        num_nodes=arguments.num_nodes,
        max_steps=arguments.max_steps,
        callbacks=[recorder],
        **QUIET_TRAINER,
        enable_checkpointing=False,
        default_root_dir=arguments.root,
    )
    trainer.fit(model, train_dataloaders=loader(), ckpt_path=arguments.ckpt_path)
    if arguments.save_to:
        trainer.save_checkpoint(arguments.save_to)
        save_weights(trainer, report / "weights.saved.pt")
    recorder.facts["end_step"] = trainer.global_step
    (report / f"report.rank{trainer.global_rank}.json").write_text(json.dumps(recorder.facts))
    del trainer, model
    end_process_group()
    return 0


def training_precision(supported: tuple[str, ...] | None) -> str:
    """Full precision where the strategy has it, else the first flag it declares: Gemini trains only
    in 16-mixed or bf16-mixed, and refuses bf16 with its default placement."""
    return "32-true" if not supported or "32-true" in supported else supported[0]


if __name__ == "__main__":
    raise SystemExit(main())
