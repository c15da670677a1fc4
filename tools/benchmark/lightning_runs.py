"""Runs through Lightning's Trainer: our strategies by name, and Lightning's own strategy classes.

The module and the Trainer are set up as a user's would be: the loss is logged with ``self.log`` every
step and shown in the progress bar, a logger writes it, and ModelCheckpoint saves a checkpoint when
the (single) epoch ends. The steps are timed as in every run; the save after them is timed on its own.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger

from tools.benchmark import optimizers
from tools.benchmark.catalogue import Run
from tools.benchmark.measure import RandomTokens, Recorder, Workload
from tools.benchmark.model import GPT, Block
from tools.benchmark.sizes import SIZES


class GPTModule(LightningModule):
    """The benchmark GPT, built in configure_model so each strategy decides where and how it is created."""

    def __init__(self, workload: Workload, optimizer: str) -> None:
        super().__init__()
        self.workload, self.optimizer_name = workload, optimizer
        self.gpt: GPT | None = None
        self.logged_steps = 0

    def configure_model(self) -> None:
        if self.gpt is None:
            self.gpt = GPT(SIZES[self.workload.size], self.workload.length, self.workload.activation_checkpointing)

    def training_step(self, batch: torch.Tensor, batch_index: int) -> torch.Tensor:
        assert self.gpt is not None
        loss = self.gpt(batch)
        # Every step, into the progress bar and the logger: the bar reads the value each step, which
        # waits for the device, as it does in a user's training.
        self.log("loss", loss, prog_bar=True)
        self.logged_steps += 1
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return optimizers.build(self.optimizer_name, self.parameters())


class RecordSteps(Callback):
    """Times the steps, and the checkpoint ModelCheckpoint saves when the epoch ends: Lightning runs
    checkpoint callbacks after the others, so this callback's epoch-end hook runs just before the
    save and its train-end hook after it (the save ends with a barrier of all ranks)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.recorder: Recorder | None = None
        self.first_step_at: float | None = None
        self.epoch_ended_at: float | None = None

    def on_train_start(self, trainer: Trainer, module: LightningModule) -> None:
        self.recorder = Recorder(self.workload, trainer.strategy.root_device)

    def on_train_batch_start(self, *arguments: Any) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, module: LightningModule, outputs: Any, *arguments: Any) -> None:
        assert self.recorder is not None
        # Lightning hands back the loss divided by accumulate_grad_batches (what backward saw); record the model's.
        self.recorder.step_ended(outputs["loss"] * trainer.accumulate_grad_batches)

    def on_train_epoch_end(self, trainer: Trainer, module: LightningModule) -> None:
        self.epoch_ended_at = time.perf_counter()

    def on_train_end(self, trainer: Trainer, module: LightningModule) -> None:
        assert self.recorder is not None and self.epoch_ended_at is not None
        checkpoint = trainer.checkpoint_callback
        path = checkpoint.last_model_path or checkpoint.best_model_path if checkpoint else ""
        self.recorder.checkpoint_saved(self.epoch_ended_at, time.perf_counter(), path or None)


def strategy_for(run: Run) -> Any:
    """The strategy argument of the Trainer: a name for our packages, a class instance for Lightning's own."""
    return run.name if run.kind == "trainer" else builtin_strategy(run.name)


def builtin_strategy(name: str) -> Any:
    """Lightning's own strategy class for ``name``, set up as the by-hand runs and our strategies are."""
    if name == "fsdp":
        from lightning.pytorch.strategies import FSDPStrategy
        from torch.distributed.fsdp import MixedPrecision

        # The same blocks sharded and the same dtypes as FSDP2 by hand and as our fsdp strategy.
        mixed = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)
        return FSDPStrategy(auto_wrap_policy={Block}, mixed_precision=mixed)
    optimizers.plain_cuda_architectures()  # both remaining built-ins are DeepSpeed's
    if name == "deepspeed_stage_2":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(stage=2)
    if name == "deepspeed_stage_3_offload":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(stage=3, offload_optimizer=True, offload_parameters=True)
    raise ValueError(f"No Lightning built-in strategy is set up for {name!r}.")


def measure(workload: Workload, run: Run, started: float) -> dict[str, Any] | None:
    """Train and return the measurements on global rank 0 (None on the other ranks)."""
    recorder = RecordSteps(workload)
    # One scratch folder per run (the harness deletes it); every rank gets the same path.
    root = Path(workload.checkpoint_dir or tempfile.mkdtemp(prefix="benchmark-checkpoint-"))
    # Lightning's default bar is RichProgressBar wherever rich is installed: name one, so that every machine's runs
    # pay for the same bar.
    callbacks: list[Callback] = [recorder, TQDMProgressBar()]
    if workload.checkpoint_dir:
        callbacks.append(ModelCheckpoint(dirpath=root / "checkpoints"))
    trainer = Trainer(
        accelerator=workload.accelerator,
        devices=workload.devices,
        strategy=strategy_for(run),
        precision=run.precision,
        max_steps=workload.steps,
        callbacks=callbacks,
        logger=CSVLogger(root, name="logs"),
        log_every_n_steps=1,
        enable_checkpointing=bool(workload.checkpoint_dir),
        enable_progress_bar=True,
        num_sanity_val_steps=0,
        default_root_dir=root,
    )
    loader = torch.utils.data.DataLoader(RandomTokens(workload), batch_size=workload.batch_size)
    module = GPTModule(workload, run.optimizer)
    trainer.fit(module, loader)
    if trainer.global_rank != 0:
        return None
    assert recorder.recorder is not None and recorder.first_step_at is not None
    strategy = trainer.strategy
    return {
        **recorder.recorder.result(),
        "setup_seconds": recorder.first_step_at - started,
        "strategy_class": f"{type(strategy).__module__}.{type(strategy).__qualname__}",
        "loss_logged_steps": module.logged_steps,
        "loss_in_progress_bar": "loss" in trainer.progress_bar_metrics,
        "progress_bar": type(trainer.progress_bar_callback).__name__ if trainer.progress_bar_callback else None,
        "backend_config": backend_config(strategy),
    }


def backend_config(strategy: Any) -> Any:
    """What the strategy handed its backend, where it keeps it, to compare with the by-hand run's."""
    config = getattr(strategy, "config", None)  # DeepSpeed: the config passed to deepspeed.initialize
    if isinstance(config, dict):
        return config
    return None
