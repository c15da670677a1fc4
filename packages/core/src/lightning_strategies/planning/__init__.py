"""Which strategy fits a model on this machine: the workload and machine descriptions plugins answer
with memory predictions, and the ranking of their answers.

Core knows no backend: each strategy package predicts its own peaks through the
``memory_plan_candidates`` hook, returning ``candidate_from(name, Prediction(...), machine)`` for each setting
worth considering. What lives here is what every model shares, one module a job: ``workload`` (the model's
shape, tokens, precision and optimizer), ``machine`` (GPUs and host memory, detected or given), ``candidates``
(the prediction and candidate types, fitting, ranking), ``advice`` (what would fit when nothing does),
``planner`` (the hook call and the plan) and ``fitted`` (core's fitted constants and their evidence).
Importing this package imports neither torch nor Lightning.
"""

from __future__ import annotations

from lightning_strategies.planning.candidates import (
    CHOICE_MARGIN,
    CPU_PROCESSES,
    Candidate,
    Prediction,
    candidate,
    candidate_from,
    fits_machine,
    host_base_bytes,
    on_cpu,
    smallest_fitting_fraction,
    with_choice_margin,
)
from lightning_strategies.planning.fitted import GIB, Fitted, unfound_evidence
from lightning_strategies.planning.machine import Machine, available_memory
from lightning_strategies.planning.planner import Plan, plan
from lightning_strategies.planning.workload import ModelShape, StateBytes, Workload, activation_bytes, parse_count

# What a strategy package's memory model may use; the rest is core's own arithmetic and ranking, in the modules.
__all__ = [
    "CHOICE_MARGIN",
    "CPU_PROCESSES",
    "GIB",
    "Candidate",
    "Fitted",
    "Machine",
    "ModelShape",
    "Plan",
    "Prediction",
    "StateBytes",
    "Workload",
    "activation_bytes",
    "available_memory",
    "candidate",
    "candidate_from",
    "fits_machine",
    "host_base_bytes",
    "on_cpu",
    "parse_count",
    "plan",
    "smallest_fitting_fraction",
    "unfound_evidence",
    "with_choice_margin",
]
