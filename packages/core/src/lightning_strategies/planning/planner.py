"""A plan: every installed package's candidates for one workload on one machine, asked through the
``memory_plan_candidates`` hook and ranked, with what would fit when nothing does."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from lightning_strategies.hooks import plugins_of
from lightning_strategies.planning import builtins
from lightning_strategies.planning.advice import nothing_fits_message, suggestions
from lightning_strategies.planning.candidates import Candidate, rank
from lightning_strategies.planning.fitted import GIB
from lightning_strategies.planning.machine import INTER_NODE_ASSUMPTION, Machine, launcher_layout
from lightning_strategies.planning.workload import DEFAULT_VOCABULARY, Workload, parse_count
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

    @property
    def advice(self) -> list[str]:
        """What the plan tells beside its table: where nothing fits, why and what would ("What would: ...",
        "No CUDA device was found ...")."""
        return [] if self.fitting else [nothing_fits_message(self)]

    def to_dict(self) -> dict[str, Any]:
        """Everything the plan says, for ``plan --json``: what was planned for, the ranked candidates, the best,
        the advice lines, the changes that would fit (``suggestions``) and the plugins whose hook failed."""
        workload, machine, shape = self.workload, self.machine, self.workload.shape
        return {
            "workload": {
                "parameters": workload.parameters,
                "layers": shape.layers,
                "hidden": shape.hidden,
                "vocabulary": shape.vocabulary,
                "sequence_length": workload.sequence_length,
                "micro_batch": workload.micro_batch,
                "precision": workload.precision,
                "optimizer": workload.optimizer,
                "activation_checkpointing": workload.activation_checkpointing,
            },
            "machine": {
                "nodes": machine.nodes,
                "gpus_per_node": machine.gpus_per_node,
                "gpus": machine.gpus,
                "gpu_memory_gib": round(machine.gpu_memory_bytes / GIB, 2),
                "host_memory_gib": round(machine.host_memory_bytes / GIB, 2),
                "nvme_gib": round(machine.nvme_bytes / GIB, 2),
                "detected": list(machine.detected),
                "inter_node_assumption": INTER_NODE_ASSUMPTION if machine.nodes > 1 else None,
            },
            "candidates": [candidate.to_dict() for candidate in self.candidates],
            "best": self.fitting[0].to_dict() if self.fitting else None,
            "advice": self.advice,
            "suggestions": list(self.suggestions),
            "problems": list(self.problems),
        }


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
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu_memory_gib: float | None = None,
    host_memory_gib: float | None = None,
    nvme_gib: float = 0.0,
    registry: Any = None,
) -> Plan:
    """Rank every installed strategy's candidates for a model on this machine (or the one described).

    ``plan("13B")`` detects the GPUs and host memory (and, under torchrun or SLURM, the nodes); ``plan("13B",
    gpus=1, gpu_memory_gib=139, host_memory_gib=128)`` plans for another machine, ``plan("70B", nodes=8,
    gpus_per_node=8, gpu_memory_gib=80, host_memory_gib=1024)`` for 8 nodes of 8 GPUs with 1 TiB of host memory
    each. ``gpus`` counts every node's GPUs. ``plan(...).best_strategy()`` is a strategy object for
    ``Trainer(strategy=...)``.
    """
    given = locals()  # these options are Workload fields of the same names
    refuse_bad_input(given)
    gpus, nodes, layout_found = node_layout(gpus, nodes, gpus_per_node, os.environ)
    training = {name: given[name] for name in ("micro_batch", "precision", "optimizer", "activation_checkpointing")}
    workload = Workload.build(params, layers, hidden, vocabulary, sequence_length=seq_len, **training)
    machine = Machine.detect(
        gpus,
        int(gpu_memory_gib * GIB) if gpu_memory_gib is not None else None,
        int(host_memory_gib * GIB) if host_memory_gib is not None else None,
        int(nvme_gib * GIB),
        nodes,
    )
    if layout_found:
        machine = dataclasses.replace(machine, detected=(*machine.detected, layout_found))
    if gpus and gpu_memory_gib is None and machine.gpu_memory_bytes == 0:
        raise ValueError(
            f"--gpus {gpus} (gpus={gpus}) asks for GPUs, but no CUDA device was found here to read their size from: "
            "pass --gpu-memory GiB (gpu_memory_gib= from Python), e.g. --gpu-memory 80 for an 80 GiB card."
        )
    return plan_for(workload, machine, registry)


# plan()'s parameters and the command line's flags for them, for errors that name both.
FLAGS = {
    "params": "--params",
    "layers": "--layers",
    "hidden": "--hidden",
    "vocabulary": "--vocabulary",
    "seq_len": "--seq-len",
    "micro_batch": "--micro-batch",
    "gpus": "--gpus",
    "nodes": "--nodes",
    "gpus_per_node": "--gpus-per-node",
    "gpu_memory_gib": "--gpu-memory",
    "host_memory_gib": "--host-memory",
    "nvme_gib": "--nvme",
}


def refuse_bad_input(given: dict[str, Any]) -> None:
    """Refuse sizes, counts and memory that are zero, negative or not numbers, naming the flag to pass: a plan
    for 0 GiB GPUs or -8 layers would rank candidates for a machine or model that does not exist."""

    def refuse(name: str, value: Any, rule: str, example: str) -> NoReturn:
        raise ValueError(f"{FLAGS[name]} {value} ({name}={value!r}): {rule}; pass e.g. {FLAGS[name]} {example}.")

    if given["params"] is not None:
        try:
            count = parse_count(given["params"])
        except ValueError:
            refuse("params", given["params"], "not a parameter count", "13B, 6.7B, 350M or 1.3e9")
        if count <= 0:
            refuse("params", given["params"], "a model needs a positive parameter count", "13B")
    for name, example in (("layers", "32"), ("hidden", "4096"), ("vocabulary", "50304"), ("seq_len", "1024")):
        _whole_at_least(given, name, 1, example, refuse)
    _whole_at_least(given, "micro_batch", 1, "8", refuse)
    _whole_at_least(given, "gpus", 0, "8 (0: a machine without GPUs)", refuse)
    _whole_at_least(given, "nodes", 1, "8", refuse)
    _whole_at_least(given, "gpus_per_node", 1, "8", refuse)
    gpus = given["gpus"]
    for name, example in (("gpu_memory_gib", "80"), ("host_memory_gib", "512"), ("nvme_gib", "1000")):
        value = given[name]
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            refuse(name, value, "not a number of GiB", example)
        # NVMe may be none; GPU memory none only where no GPU is asked for.
        allowed_zero = name == "nvme_gib" or (name == "gpu_memory_gib" and gpus == 0)
        if value < 0 or (value == 0 and not allowed_zero):
            refuse(name, value, "memory must be more than 0 GiB", example)


def node_layout(
    gpus: int | None, nodes: int | None, gpus_per_node: int | None, environ: Mapping[str, str]
) -> tuple[int | None, int, str]:
    """(GPUs in all or None to detect them, nodes, what was read from the launcher's environment or "").

    ``gpus`` alone is every GPU, on one node; with ``nodes`` it is spread over them; ``nodes`` and
    ``gpus_per_node`` make ``gpus`` their product. Without any of the three, torchrun's or SLURM's environment
    says, where there is one; else this node's GPUs, detected.
    """
    if gpus is None and nodes is None and gpus_per_node is None:
        layout = launcher_layout(environ)
        if layout is None:
            return None, 1, ""
        found_nodes, per_node, launcher = layout
        return found_nodes * per_node, found_nodes, f"nodes and gpus_per_node ({launcher})"
    if gpus_per_node is not None:
        nodes = nodes or (gpus // gpus_per_node if gpus and gpus % gpus_per_node == 0 else nodes) or 1
        total = nodes * gpus_per_node
        if gpus is not None and gpus != total:
            raise ValueError(
                f"--gpus {gpus} contradicts --nodes {nodes} --gpus-per-node {gpus_per_node} ({total} GPUs in all): "
                f"pass --gpus {total}, or leave --gpus out (gpus= from Python): --nodes and --gpus-per-node say it."
            )
        return total, nodes, ""
    nodes = nodes or 1
    if gpus is not None and gpus % nodes:
        raise ValueError(
            f"--gpus {gpus} does not spread evenly over --nodes {nodes}: --gpus counts every node's GPUs; pass "
            f"--gpus-per-node instead (gpus_per_node= from Python), e.g. --nodes {nodes} --gpus-per-node 8."
        )
    if gpus == 0 and nodes > 1:
        raise ValueError(f"--gpus 0 with --nodes {nodes}: the planner plans CPU training on one node; pass --nodes 1.")
    return gpus, nodes, ""


def _whole_at_least(given: dict[str, Any], name: str, least: int, example: str, refuse: Callable[..., None]) -> None:
    value = given[name]
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        refuse(name, value, "not a whole number", example)
    elif value < least:
        refuse(name, value, f"must be at least {least}", example)


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
    """Every plugin's answer, keeping only names the registry can resolve (not clashing, not disabled), and
    Lightning's own plain strategies."""
    asked = plugins_of(registry).memory_plan_candidates(workload, machine)
    problems.extend(str(failure) for failure in asked.failures)
    plain = builtins.candidates(workload, machine, registry)
    return [*plain, *(c for answer in asked.answers for c in answer if c.strategy in registry)]
