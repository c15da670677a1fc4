"""A plan: every installed package's candidates for one workload on one machine, asked through the
``memory_plan_candidates`` hook and ranked, with what would fit when nothing does."""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_strategies.hooks import plugins_of
from lightning_strategies.planning.advice import nothing_fits_message, suggestions
from lightning_strategies.planning.candidates import Candidate, rank
from lightning_strategies.planning.fitted import GIB
from lightning_strategies.planning.machine import Machine
from lightning_strategies.planning.workload import DEFAULT_VOCABULARY, Workload
from lightning_strategies.registry import get_registry


@dataclasses.dataclass
class Plan:
    """Ranked candidates for one workload on one machine; where none fits, what would."""

    workload: Workload
    machine: Machine
    candidates: list[Candidate]
    suggestions: list[str]
    problems: list[str] = dataclasses.field(default_factory=list)  # plugins whose hook failed

    @property
    def fitting(self) -> list[Candidate]:
        return [candidate for candidate in self.candidates if candidate.fits]

    def best(self) -> Candidate:
        """The first candidate that fits, or an error saying what would make one fit."""
        if not self.fitting:
            raise ValueError(nothing_fits_message(self))
        return self.fitting[0]

    def best_strategy(self, namespace: str = "lightning.pytorch", **overrides: Any) -> Any:
        """The best candidate's strategy object, ready for the Trainer."""
        return self.best().strategy_object(namespace, **overrides)


def plan(
    params: int | str | None = None,
    *,
    layers: int | None = None,
    hidden: int | None = None,
    vocabulary: int = DEFAULT_VOCABULARY,
    seq_len: int = 1024,
    micro_batch: int = 8,
    precision: str = "bf16-mixed",
    optimizer: str = "adam",
    activation_checkpointing: bool = False,
    gpus: int | None = None,
    gpu_memory_gib: float | None = None,
    host_memory_gib: float | None = None,
    nvme_gib: float = 0.0,
    registry: Any = None,
) -> Plan:
    """Rank every installed strategy's candidates for a model on this machine (or the one described).

    ``plan("13B")`` detects the GPUs and host memory; ``plan("13B", gpus=1, gpu_memory_gib=139,
    host_memory_gib=128)`` plans for another machine. ``plan(...).best_strategy()`` is a strategy object
    for ``Trainer(strategy=...)``.
    """
    given = locals()  # these options are Workload fields of the same names
    training = {name: given[name] for name in ("micro_batch", "precision", "optimizer", "activation_checkpointing")}
    workload = Workload.build(params, layers, hidden, vocabulary, sequence_length=seq_len, **training)
    machine = Machine.detect(
        gpus,
        int(gpu_memory_gib * GIB) if gpu_memory_gib is not None else None,
        int(host_memory_gib * GIB) if host_memory_gib is not None else None,
        int(nvme_gib * GIB),
    )
    return plan_for(workload, machine, registry)


def plan_for(workload: Workload, machine: Machine, registry: Any = None) -> Plan:
    if registry is None:
        registry = get_registry()
    problems: list[str] = []

    def ask(trial_workload: Workload, trial_machine: Machine) -> list[Candidate]:
        return collect_candidates(registry, trial_workload, trial_machine, problems)

    candidates = rank(ask(workload, machine))
    found = [] if any(c.fits for c in candidates) else suggestions(workload, machine, ask)
    return Plan(workload, machine, candidates, found, sorted(set(problems)))


def collect_candidates(registry: Any, workload: Workload, machine: Machine, problems: list[str]) -> list[Candidate]:
    """Every plugin's answer, keeping only names the registry can resolve (not clashing, not disabled)."""
    asked = plugins_of(registry).memory_plan_candidates(workload, machine)
    problems.extend(str(failure) for failure in asked.failures)
    return [c for answer in asked.answers for c in answer if c.strategy in registry]
