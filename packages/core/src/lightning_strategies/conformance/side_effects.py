"""Whether runs under a strategy leave the process as they found it.

``python -m lightning_strategies.conformance.side_effects OUT NAME...`` runs, in this one process, Lightning's own
``ddp`` first (what Lightning itself leaves set, such as its launcher's rendezvous, is then set already), then under
each name ``fit``, ``validate``, ``test`` and ``predict`` on one CPU device, and writes to ``OUT`` what each name's
runs changed: ``{name: {what: [before, after]}}``, empty where nothing changed. ``--fabric`` sets up and steps a
model under Fabric instead, then drops it and collects garbage: Fabric never tears its strategy down.

What is compared: ``os.environ``, torch's process-wide switches (default dtype, grad mode, deterministic algorithms,
threads), the warnings filters, the levels of the loggers that existed before the run, and Lightning's strategy
registries.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from lightning_strategies.conformance.model import ConformanceModel, loader
from lightning_strategies.conformance.suite import first_optimizer, quiet_lightning, registered_entry
from lightning_strategies.conformance.trainer_arguments import QUIET_TRAINER
from lightning_strategies.entries import import_target

BASELINE = "ddp"
_REGISTRIES = {"lightning.pytorch.strategies": "StrategyRegistry", "lightning.fabric.strategies": "STRATEGY_REGISTRY"}


def process_state() -> dict[str, str]:
    """What a strategy could leave changed for the rest of the process, each as a string."""
    state = {f"os.environ[{name!r}]": value for name, value in os.environ.items()}
    state["torch.get_default_dtype()"] = str(torch.get_default_dtype())
    state["torch.is_grad_enabled()"] = str(torch.is_grad_enabled())
    state["torch.are_deterministic_algorithms_enabled()"] = str(torch.are_deterministic_algorithms_enabled())
    state["torch.get_num_threads()"] = str(torch.get_num_threads())
    state["warnings.filters"] = repr(warnings.filters)
    for name, logger in logging.Logger.manager.loggerDict.items():
        if isinstance(logger, logging.Logger):
            state[f"level of logger {name!r}"] = logging.getLevelName(logger.level)
    for module_name, attribute in _REGISTRIES.items():
        module = sys.modules.get(module_name)
        if module is not None:
            for name, entry in getattr(module, attribute).items():
                state[f"{module_name}.{attribute}[{name!r}]"] = repr(entry.get("init_params"))
    return state


def changes(before: dict[str, str], after: dict[str, str]) -> dict[str, list[str | None]]:
    """What differs; a logger created during the run is no change (modules create theirs when imported)."""
    return {
        what: [before.get(what), after.get(what)]
        for what in sorted(before.keys() | after.keys())
        if before.get(what) != after.get(what) and not (what.startswith("level of logger") and what not in before)
    }


def strategy_for(name: str, options: dict[str, Any], fabric: bool) -> Any:
    """The name itself, or, with options, the instance Lightning's registry builds with them added."""
    if not options:
        return name
    module_name = "lightning.fabric.strategies" if fabric else "lightning.pytorch.strategies"
    entry = import_target(f"{module_name}:{_REGISTRIES[module_name]}")[name]
    return entry["strategy"](**{**entry["init_params"], **options})


def trainer_runs(name: str, options: dict[str, Any]) -> None:
    from lightning.pytorch import Trainer

    model = ConformanceModel(first_optimizer(registered_entry(name)))
    trainer = Trainer(
        strategy=strategy_for(name, options, fabric=False),
        accelerator="cpu",
        devices=1,
        max_steps=2,
        limit_val_batches=1,
        enable_checkpointing=False,
        **QUIET_TRAINER,
    )
    trainer.fit(model, loader(), loader())
    trainer.validate(model, loader())
    trainer.test(model, loader())
    trainer.predict(model, loader())


def fabric_run(name: str, options: dict[str, Any]) -> None:
    from lightning.fabric import Fabric

    fabric = Fabric(strategy=strategy_for(name, options, fabric=True), accelerator="cpu", devices=1)
    fabric.launch()
    module = ConformanceModel().layers
    optimizer = import_target(first_optimizer(registered_entry(name)))(module.parameters(), lr=0.01)
    module, optimizer = fabric.setup(module, optimizer)
    inputs, targets = next(iter(loader()))
    fabric.backward(torch.nn.functional.mse_loss(module(inputs), targets))
    optimizer.step()
    del fabric, module, optimizer
    gc.collect()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_strategies.conformance.side_effects")
    parser.add_argument("out", type=Path)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--fabric", action="store_true", help="run under Fabric instead of the Trainer")
    parser.add_argument("--options", type=json.loads, default={}, help="JSON: {name: {constructor keyword: value}}")
    arguments = parser.parse_args(argv)
    quiet_lightning()
    run = fabric_run if arguments.fabric else trainer_runs
    run(BASELINE, {})
    found = {}
    for name in arguments.names:
        before = process_state()
        run(name, arguments.options.get(name, {}))
        found[name] = changes(before, process_state())
    arguments.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
