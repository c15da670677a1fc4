"""The conformance suite itself, run by every rank of one process group.

Checkpoints are judged by behaviour, not by file layout: a model restored from a checkpoint must
predict exactly what the saved model predicted, and a run resumed from a checkpoint must end
where an uninterrupted run ends. That holds for sharded and unsharded strategies alike.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from typing_extensions import override

from lightning_strategies.conformance.model import SAMPLES, ConformanceModel, loader
from lightning_strategies.conformance.tolerances import tolerance_for
from lightning_strategies.conformance.trainer_arguments import QUIET_TRAINER
from lightning_strategies.entries import StrategyEntry
from lightning_strategies.registry import get_registry


@dataclass
class CheckResult:
    check: str
    passed: bool
    detail: str = ""


@dataclass
class SuiteOptions:
    strategy: str
    accelerator: str = "cpu"
    devices: int = 1
    precision: str = "32-true"
    workdir: str = "."

    @classmethod
    def from_arguments(cls, arguments: argparse.Namespace) -> SuiteOptions:
        """The options ``run_parser`` read from a command line."""
        return cls(**{option.name: getattr(arguments, option.name) for option in fields(cls)})

    def optimizer(self) -> str:
        """The optimizer the conformance model trains with under this strategy (``first_optimizer``)."""
        return first_optimizer(registered_entry(self.strategy))

    def trainer_flags(self) -> dict[str, Any]:
        """What every Trainer of a run is given: the strategy under test, on these devices, in this precision."""
        return {
            "strategy": self.strategy,
            "accelerator": self.accelerator,
            "devices": self.devices,
            "precision": self.precision,
        }


def run_parser(prog: str) -> argparse.ArgumentParser:
    """The options of every conformance run (the fields of ``SuiteOptions``), for its command line."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--workdir", required=True)
    return parser


def quiet_lightning() -> None:
    """A run's report is its output: Lightning's per-run chatter would bury it."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def registered_entry(strategy: str) -> StrategyEntry | None:
    """The registry's entry for ``strategy``, or None for a name it does not hold (a Lightning built-in)."""
    registry = get_registry()
    return registry.entry(strategy) if strategy in registry else None


def first_optimizer(entry: StrategyEntry | None) -> str:
    """The optimizer the strategy's metadata names first (Gemini trains only with its own), else Adam."""
    return entry.optimizers[0] if entry and entry.optimizers else "torch.optim:Adam"


class _CollectiveProbe(Callback):
    """Exercises reduce, all_gather, broadcast and barrier once the process group exists."""

    def __init__(self) -> None:
        self.results: list[CheckResult] = []

    @override
    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        strategy = trainer.strategy
        world, rank = trainer.world_size, trainer.global_rank
        device = pl_module.device
        self.results = [
            _check_value(
                "reduce sum",
                strategy.reduce(torch.tensor(rank + 1.0, device=device), reduce_op="sum"),
                world * (world + 1) / 2,
            ),
            _check_value(
                "reduce mean",
                strategy.reduce(torch.tensor(rank + 1.0, device=device), reduce_op="mean"),
                (world + 1) / 2,
            ),
            _check_all_gather(strategy.all_gather(torch.tensor([float(rank)], device=device)), world),
            _check_value("broadcast", torch.tensor(float(strategy.broadcast(100 + rank, src=0))), 100.0),
        ]
        strategy.barrier("conformance")
        self.results.append(CheckResult("barrier", True, "all ranks passed the barrier"))


def _check_value(check: str, value: torch.Tensor, expected: float) -> CheckResult:
    got = float(value)
    return CheckResult(check, math.isclose(got, expected, rel_tol=1e-6), f"got {got}, expected {expected}")


def _check_all_gather(gathered: torch.Tensor, world: int) -> CheckResult:
    expected = [float(rank) for rank in range(world)]
    got = gathered.reshape(-1).tolist()
    return CheckResult("all_gather", got == expected, f"got {got}, expected {expected}")


def _predictions(batches: list[Any] | None) -> torch.Tensor:
    if not batches:
        return torch.empty(0)
    return torch.cat([batch.detach().float().cpu() for batch in batches])


def _compare(check: str, got: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> CheckResult:
    if got.shape != expected.shape:
        return CheckResult(
            check, False, f"{what}: prediction shapes differ ({tuple(got.shape)} vs {tuple(expected.shape)})"
        )
    if got.numel() == 0:
        return CheckResult(check, False, f"{what}: no predictions were produced")
    difference = float((got - expected).abs().max())
    scale = float(expected.abs().max()) or 1.0
    passed = difference <= tolerance * max(1.0, scale)
    return CheckResult(check, passed, f"{what}: max abs difference {difference:.3g} (tolerance {tolerance:g})")


class ConformanceSuite:
    """Runs each check in order; a check that raises is recorded and ends the suite."""

    def __init__(self, options: SuiteOptions) -> None:
        self.options = options
        self.results: list[CheckResult] = []
        self.optimizer = options.optimizer()
        self.tolerance = tolerance_for(options.precision)
        self.workdir = Path(options.workdir)

    def trainer(self, **overrides: Any) -> Trainer:
        settings: dict[str, Any] = {
            **self.options.trainer_flags(),
            **QUIET_TRAINER,
            "enable_checkpointing": False,
            "default_root_dir": str(self.workdir),
        }
        settings.update(overrides)
        return Trainer(**settings)

    def model(self, seed: int) -> ConformanceModel:
        """A model whose initial weights depend on ``seed``; everything else is seeded alike.

        Only the weights may differ: Lightning seeds the distributed sampler from the global
        seed, so two runs that are compared must share it.
        """
        torch.manual_seed(seed)
        model = ConformanceModel(optimizer=self.optimizer)
        seed_everything(0, verbose=False)
        return model

    def run(self) -> list[CheckResult]:
        steps: list[Callable[[], None]] = [
            self.check_stages_and_collectives,
            self.check_round_trip_and_resume,
        ]
        for step in steps:
            try:
                step()
            except Exception as error:
                detail = "".join(traceback.format_exception_only(type(error), error)).strip()
                self.results.append(CheckResult(step.__name__.removeprefix("check_"), False, detail))
                self.results.append(CheckResult("traceback", False, traceback.format_exc(limit=-6)))
                break
        return self.results

    def check_stages_and_collectives(self) -> None:
        probe = _CollectiveProbe()
        model = self.model(seed=0)
        trainer = self.trainer(max_epochs=2, callbacks=[probe])
        before = trainer.validate(model, dataloaders=loader(), verbose=False)
        trainer.fit(model, train_dataloaders=loader(), val_dataloaders=loader())
        validated = trainer.validate(model, dataloaders=loader(), verbose=False)
        loss_before, loss_after = before[0]["val_loss"], validated[0]["val_loss"]
        self.results.append(
            CheckResult(
                "fit",
                len(model.train_losses) > 0 and loss_after < loss_before,
                f"{len(model.train_losses)} steps on this rank, validation loss {loss_before:.4f} -> {loss_after:.4f}",
            )
        )
        if trainer.world_size > 1:
            self.results.extend(probe.results)
        tested = trainer.test(model, dataloaders=loader(), verbose=False)
        predicted = _predictions(trainer.predict(model, dataloaders=loader()))
        self.results.append(_finite_metric("validate", validated, "val_loss"))
        self.results.append(_finite_metric("test", tested, "test_loss"))
        expected_rows = SAMPLES // trainer.world_size
        self.results.append(
            CheckResult("predict", predicted.shape[0] == expected_rows, f"{predicted.shape[0]} rows on this rank")
        )

    def check_round_trip_and_resume(self) -> None:
        checkpoint = str(self.workdir / "after-one-epoch.ckpt")
        model = self.model(seed=0)
        trainer = self.trainer(max_epochs=1)
        trainer.fit(model, train_dataloaders=loader())
        trainer.save_checkpoint(checkpoint)
        saved = _predictions(trainer.predict(model, dataloaders=loader()))

        restored = _predictions(self.trainer().predict(self.model(seed=99), dataloaders=loader(), ckpt_path=checkpoint))
        self.results.append(
            _compare("checkpoint round trip", restored, saved, self.tolerance, "restored vs saved model")
        )

        resumed_model = self.model(seed=99)
        self.trainer(max_epochs=2).fit(resumed_model, train_dataloaders=loader(), ckpt_path=checkpoint)
        resumed = _predictions(self.trainer().predict(resumed_model, dataloaders=loader()))

        uninterrupted_model = self.model(seed=0)
        self.trainer(max_epochs=2).fit(uninterrupted_model, train_dataloaders=loader())
        uninterrupted = _predictions(self.trainer().predict(uninterrupted_model, dataloaders=loader()))
        self.results.append(
            _compare("resume equality", resumed, uninterrupted, self.tolerance, "resumed vs uninterrupted run")
        )


def _finite_metric(check: str, metrics: Sequence[Mapping[str, float]], key: str) -> CheckResult:
    value = metrics[0].get(key) if metrics else None
    passed = value is not None and math.isfinite(float(value))
    return CheckResult(check, passed, f"{key}={value}")


def rank_report_path(report: str, rank: int) -> str:
    return f"{report}.rank{rank}.json"


def results_as_dicts(results: list[CheckResult]) -> list[dict[str, Any]]:
    return [asdict(result) for result in results]


def current_rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
