"""One training run of the reliability tier, meant to be interrupted: every rank runs this module.

``python -m lightning_strategies.conformance.scenarios`` trains the conformance model with a
checkpoint at every epoch end and prints, from rank 0, the events the driver in
``reliability.py`` times its kills on::

    @resumed epoch=E            training starts at epoch E (0 when fresh)
    @save-begin NAME epoch=E    checkpoint NAME (last.ckpt among them) of epoch E is being written
    @save-end NAME epoch=E      ... and is complete
    @done                       training ended; predictions.rank<R>.pt are written

With ``--fail-rank R`` rank R fails in ``training_step`` at global step ``--fail-step``, by
raising or by SIGKILL, after writing the time to ``failed-at``.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies.conformance.model import ConformanceModel, loader
from lightning_strategies.conformance.reliability import CHECKPOINTS, FAILED_AT
from lightning_strategies.conformance.suite import SuiteOptions, quiet_lightning, run_parser
from lightning_strategies.conformance.trainer_arguments import QUIET_TRAINER


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = run_parser("python -m lightning_strategies.conformance.scenarios")
    parser.add_argument("--max-epochs", type=int, default=6)
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--fail-how", choices=("raise", "kill"), default="raise")
    parser.add_argument("--fail-step", type=int, default=3)
    return parser.parse_args(argv)


def announce(trainer: Trainer, event: str) -> None:
    if trainer.is_global_zero:
        print(f"@{event}", flush=True)


class AnnouncedCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that says when each save starts and ends."""

    @override
    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        name = Path(filepath).name
        announce(trainer, f"save-begin {name} epoch={trainer.current_epoch}")
        super()._save_checkpoint(trainer, filepath)
        announce(trainer, f"save-end {name} epoch={trainer.current_epoch}")


class Events(Callback):
    @override
    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        announce(trainer, f"resumed epoch={trainer.current_epoch}")


class ScenarioModel(ConformanceModel):
    """The conformance model carrying 32 MB of state it never uses, so that a save lasts long enough
    (tenths of a second) for kills to land inside it; it can fail on purpose in ``training_step``."""

    def __init__(self, optimizer: str, failure: argparse.Namespace | None = None, workdir: Path | None = None) -> None:
        super().__init__(optimizer=optimizer)
        self.register_buffer("ballast", torch.zeros(8 * 1024 * 1024))
        self.failure, self.workdir = failure, workdir

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        failure = self.failure
        if failure and self.global_rank == failure.fail_rank and self.global_step == failure.fail_step:
            assert self.workdir is not None
            (self.workdir / FAILED_AT).write_text(repr(time.time()))
            if failure.fail_how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            # The message does not name the rank: the check looks for the other ranks' word on it.
            raise RuntimeError("failing on purpose (conformance check of failed-rank exit)")
        return super().training_step(batch, batch_idx)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    quiet_lightning()
    options = SuiteOptions.from_arguments(arguments)
    workdir = Path(options.workdir)
    torch.manual_seed(0)
    model = ScenarioModel(options.optimizer(), arguments if arguments.fail_rank is not None else None, workdir)
    seed_everything(0, verbose=False)
    callbacks: list[Callback] = [
        Events(),
        AnnouncedCheckpoint(dirpath=workdir / CHECKPOINTS, save_last=True, every_n_epochs=1),
    ]
    trainer = Trainer(
        **options.trainer_flags(),
        **QUIET_TRAINER,
        max_epochs=arguments.max_epochs,
        callbacks=callbacks,
        default_root_dir=str(workdir),
    )
    trainer.fit(model, train_dataloaders=loader(), ckpt_path="last" if arguments.resume else None)
    batches = trainer.predict(model, dataloaders=loader()) or []
    predictions = torch.cat([batch.float().cpu() for batch in batches])  # type: ignore[union-attr]
    torch.save(predictions, workdir / f"predictions.rank{trainer.global_rank}.pt")
    announce(trainer, "done")
    end_process_group()  # before exit, so that gloo's threads cannot abort a run that passed
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
