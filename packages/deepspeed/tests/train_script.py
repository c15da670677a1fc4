"""Real training runs for the tests, as their own program: Lightning's launcher re-runs it per rank.

Trains a small MLP on fixed random data with the strategy named on the command line, then writes
the final full weights (gathered under ZeRO-3) and a few counters as JSON-friendly torch data.
With ``--runs``, one launch trains several runs one after another in the same processes, each with a
new model and Trainer (as users do in notebooks and sweeps): a launch costs about ten seconds on two
cores (two interpreters importing torch, Lightning and DeepSpeed, and a gloo rendezvous), a run of
these few steps about one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

from lightning_strategies.conformance.launching import end_process_group


class Regression(LightningModule):
    def __init__(
        self, optimizer: str = "sgd", learning_rate: float = 0.05, scheduler: bool = False, hidden: int = 32
    ) -> None:
        super().__init__()
        self.optimizer_name = optimizer
        self.learning_rate = learning_rate
        self.use_scheduler = scheduler
        self.net = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 4))
        self.optimizer_steps = 0
        self.backward_calls = 0
        self.loaded_mp_world_size = None
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs).float(), targets.float())
        self.log("train_loss", loss)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(inputs).float(), targets.float()), sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def on_after_backward(self):
        self.backward_calls += 1

    def on_before_optimizer_step(self, optimizer):
        self.optimizer_steps += 1

    def on_save_checkpoint(self, checkpoint):
        checkpoint["mp_world_size"] = 4  # a user's entry named like one of DeepSpeed's own

    def on_load_checkpoint(self, checkpoint):
        self.loaded_mp_world_size = checkpoint.get("mp_world_size")

    def configure_optimizers(self):
        parameters = [parameter for parameter in self.parameters() if parameter.requires_grad]
        if self.optimizer_name == "cpu_adam":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(parameters, lr=self.learning_rate, adamw_mode=False)
        elif self.optimizer_name == "adam":
            optimizer = torch.optim.Adam(parameters, lr=self.learning_rate)
        else:
            optimizer = torch.optim.SGD(parameters, lr=self.learning_rate)
        if not self.use_scheduler:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def data(batch_size: int, batches: int) -> DataLoader:
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(batch_size * batches, 16, generator=generator)
    targets = torch.randn(batch_size * batches, 4, generator=generator)
    return DataLoader(TensorDataset(inputs, targets), batch_size=batch_size, shuffle=False)


def full_weights(strategy, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    parameters = list(module.parameters())
    if getattr(strategy, "zero_stage_3", False):
        import deepspeed

        with deepspeed.zero.GatheredParameters(parameters):
            return {name: tensor.detach().float().clone() for name, tensor in module.named_parameters()}
    return {name: tensor.detach().float().clone() for name, tensor in module.named_parameters()}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="deepspeed")
    parser.add_argument("--strategy-options", default="{}", help="JSON: constructor arguments")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--max-epochs", type=int, default=None, help="stop after whole epochs instead of --max-steps")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--batches", type=int, default=16, help="batches in the whole dataset")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--scheduler", action="store_true")
    parser.add_argument("--hidden", type=int, default=32, help="width of the hidden layer")
    parser.add_argument("--frozen", action="store_true", help="the first layer is frozen (a fine-tune of the rest)")
    parser.add_argument(
        "--tied-and-buffers", action="store_true", help="a batch norm (buffers) between two layers sharing one weight"
    )
    parser.add_argument("--save", default=None, help="checkpoint to write at the end of each epoch (ModelCheckpoint)")
    parser.add_argument("--resume", default=None, help="checkpoint to resume from")
    parser.add_argument(
        "--break-saves-from-epoch", type=int, default=None, help="from this epoch on, every checkpoint save fails"
    )
    parser.add_argument("--validate", action="store_true")
    parser.add_argument(
        "--load-each",
        default=None,
        help="JSON list of checkpoints: instead of fitting, validate, test and predict in turn on one Trainer and "
        "model, each call loading the next checkpoint (ckpt_path=); rank 0 writes the weights after each",
    )
    parser.add_argument("--out", default=None, help="where rank 0 writes the results (torch.save)")
    parser.add_argument(
        "--runs",
        default=None,
        help="JSON list of runs, each a dict of these options (with its own out), trained one after another in "
        "the same processes: every launch pays for importing DeepSpeed and forming the group again",
    )
    return parser


def flags(**arguments: Any) -> list[str]:
    """The command-line flags for ``arguments`` (named as the options, with underscores)."""
    command: list[str] = []
    for name, value in arguments.items():
        flag = "--" + name.replace("_", "-")
        if name == "strategy_options" and not isinstance(value, str):
            value = json.dumps(value)
        if value is True:
            command.append(flag)
        elif value is not None and value is not False:
            command += [flag, str(value)]
    return command


def train(arguments: argparse.Namespace) -> None:
    """One run: a new model and Trainer, fit, and rank 0's results written to ``arguments.out``."""
    before = {
        "deepspeed_imported": "deepspeed" in sys.modules,
        "environment_accelerator": os.environ.get("DS_ACCELERATOR"),
    }
    seed_everything(7, workers=True)
    model = Regression(arguments.optimizer, scheduler=arguments.scheduler, hidden=arguments.hidden)
    model.net[0].requires_grad_(not arguments.frozen)
    if arguments.tied_and_buffers:
        first, second = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        second.weight = first.weight
        layers = (first, torch.nn.BatchNorm1d(16), second, torch.nn.Tanh(), torch.nn.Linear(16, 4))
        model.net = torch.nn.Sequential(*layers)
    strategy = arguments.strategy
    options = json.loads(arguments.strategy_options)
    if options and strategy.startswith("fsdp"):  # the cross-strategy matrix: fsdp with state_dict_type="full"
        from lightning_strategies_fsdp.strategy import FSDP2Strategy

        strategy = FSDP2Strategy(**options)
    elif options:
        from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy

        strategy = DeepSpeedStrategy(**options)
    callbacks = [_epoch_end_checkpoint(arguments.save)] if arguments.save else []
    if arguments.break_saves_from_epoch is not None:
        callbacks.append(_BreakSaves(arguments.break_saves_from_epoch))
    trainer = Trainer(
        accelerator="cpu",
        devices=arguments.devices,
        strategy=strategy,
        precision=arguments.precision,
        max_steps=-1 if arguments.max_epochs else arguments.max_steps,
        max_epochs=arguments.max_epochs,
        accumulate_grad_batches=arguments.accumulate,
        gradient_clip_val=arguments.clip,
        limit_val_batches=2 if arguments.validate else 0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=arguments.save is not None,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,  # every rank sees the same batches: results comparable across world sizes
    )
    loader = data(arguments.batch_size, arguments.batches)
    messages = _InfoMessages()
    if arguments.load_each:
        return _load_each(trainer, model, loader, json.loads(arguments.load_each), Path(arguments.out))
    with messages:
        trainer.fit(model, loader, loader if arguments.validate else None, ckpt_path=arguments.resume)
    weights = full_weights(trainer.strategy, model)
    if trainer.is_global_zero:
        result = {
            "weights": weights,
            "global_step": trainer.global_step,
            "optimizer_steps": model.optimizer_steps,
            "backward_calls": model.backward_calls,
            "strategy_class": type(trainer.strategy).__module__ + "." + type(trainer.strategy).__qualname__,
            "config": json.loads(json.dumps(getattr(trainer.strategy, "config", None), default=str)),
            "ds_accelerator": _deepspeed_accelerator(),
            "environment_accelerator": os.environ.get("DS_ACCELERATOR"),
            "before_run": before,
            "learning_rate": trainer.optimizers[0].param_groups[0]["lr"],
            "loaded_mp_world_size": model.loaded_mp_world_size,
            "losses": model.losses,
            "info_messages": messages.messages,
        }
        torch.save(result, Path(arguments.out))


def main() -> None:
    arguments = parser().parse_args()
    if arguments.runs is None:
        return train(arguments)
    runs = [parser().parse_args(flags(**run)) for run in json.loads(arguments.runs)]
    if len({run.devices for run in runs}) > 1:
        raise SystemExit("the runs of one launch share its processes: give them all the same --devices")
    for run in runs:
        try:
            train(run)
        except Exception as error:  # one failing run must not hide the others' results
            if int(os.environ.get("LOCAL_RANK", "0")) == 0:
                torch.save({"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}, run.out)


def _load_each(trainer: Trainer, model: Regression, loader: DataLoader, checkpoints: list[str], out: Path) -> None:
    """Repeated loads on one Trainer and model (issue 29, item 6): under FSDP the second one failed."""
    calls = [trainer.validate, trainer.test, trainer.predict]
    weights = []
    for index, checkpoint in enumerate(checkpoints):
        calls[index % len(calls)](model, loader, ckpt_path=checkpoint)
        weights.append(full_weights(trainer.strategy, model))
    if trainer.is_global_zero:
        torch.save({"weights_after": weights}, out)


class _InfoMessages(logging.Handler):
    """The lines Lightning's loggers (rank_zero_info's among them) log while fit runs."""

    # rank_zero_info logs under one of these, whichever Lightning imported last; neither propagates.
    NAMES = ("lightning.pytorch", "lightning.fabric")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        self._levels: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> _InfoMessages:
        for name in self.NAMES:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.addHandler(self)
            logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).removeHandler(self)
            logging.getLogger(name).setLevel(level)


def _epoch_end_checkpoint(path: str):
    from lightning.pytorch.callbacks import ModelCheckpoint

    # An epoch-end checkpoint resumes at the start of the next epoch, as uninterrupted training continues.
    target = Path(path)
    return ModelCheckpoint(dirpath=target.parent, filename=target.stem, every_n_epochs=1, save_top_k=1)


class _BreakSaves(Callback):
    """A save that dies half way: from ``epoch`` on, every rank's checkpoint write raises right after
    DeepSpeed has written that rank's optimizer-state file (as a full disk would, mid-save)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != self.epoch:
            return
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

        write = TorchCheckpointEngine.save

        def write_then_fail(engine, state_dict, path):
            write(engine, state_dict, path)
            if str(path).endswith("optim_states.pt"):
                raise OSError(f"injected failure after writing {path}")

        TorchCheckpointEngine.save = write_then_fail


def _deepspeed_accelerator() -> str | None:
    if "deepspeed" not in sys.modules:
        return None
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name()


if __name__ == "__main__":
    main()
    end_process_group()  # before exit, so that gloo's threads cannot abort it
