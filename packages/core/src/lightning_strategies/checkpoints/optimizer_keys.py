"""Optimizer states keyed by parameter name, from those torch keys by position.

torch's ``Optimizer.state_dict()`` (what ``ddp`` saves) keys each parameter's state by its position in the
optimizer's param groups; FSDP2 and DeepSpeed's universal layout key it by parameter name. A full checkpoint file
records both the model's ``state_dict`` names and the optimizer's positions, but not which position is which name,
except where every ``state_dict`` entry is a parameter the optimizer trains: torch then numbers the parameters in
the order the module lists them, which is the ``state_dict``'s. That order holds for one param group built from
``module.parameters()``; several groups (a weight-decay split) number their parameters group after group, which the
file does not record: where the weights are given, every state tensor's size is checked against its parameter's, which
such a split breaks (it pairs matrices with vectors). Converters into a name-keyed layout use this, and refuse (or keep
the positions) where it does not hold.

Param groups differ between the Adam-family optimizers that resume one another's states (HybridAdam, which
ColossalAI requires, has ``bias_correction``; torch's Adam has ``foreach``, ``fused``, ...), and torch's loaders
refuse a key they do not have: ``adopted_param_groups`` takes the saved values of the keys the resuming optimizer
has, and warns of the saved settings it drops that change how the run trains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_warn

from lightning_strategies.errors import CheckpointError

# Saved settings that choose how torch computes a step, not what it computes: dropped without a word.
_IMPLEMENTATION_KEYS = frozenset({"foreach", "fused", "capturable", "differentiable"})
# Saved settings that every optimizer taking Adam's moments applies anyway: HybridAdam's bias_correction=True is what
# torch's Adam and AdamW always do.
_ALWAYS_APPLIED = {"bias_correction": True}


def keyed_by_name(
    optimizer_state: Mapping[str, Any], names: Sequence[str] | Mapping[str, Any]
) -> dict[str, Any] | None:
    """``optimizer_state`` (torch's ``Optimizer.state_dict()`` layout) with its ``state`` and ``param_groups`` keyed
    by parameter name: as it is where it is keyed by name already; converted where it is keyed by the positions
    ``0 .. len(names) - 1``, ``names`` being the model's ``state_dict`` names in order, or the ``state_dict`` itself;
    None where which state is whose is not recorded (positions for only some of the entries: the others are buffers
    or frozen weights), or, given the ``state_dict``, where a state tensor's size differs from that of the parameter
    it would go to."""
    weights = names if isinstance(names, Mapping) else None
    names = list(names)
    groups = optimizer_state.get("param_groups") or []
    keys = [key for group in groups for key in group.get("params", [])]
    if all(isinstance(key, str) for key in keys):
        return dict(optimizer_state)
    if not (all(isinstance(key, int) for key in keys) and sorted(keys) == list(range(len(names)))):
        return None
    state = optimizer_state.get("state") or {}
    if weights is not None and any(
        isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() != weights[names[key]].numel()
        for key, states in state.items()
        for value in states.values()
    ):
        return None
    return {
        **optimizer_state,
        "state": {names[key]: value for key, value in state.items()},
        "param_groups": [{**group, "params": [names[key] for key in group.get("params", [])]} for group in groups],
    }


def adopted_param_groups(
    saved_groups: Sequence[Mapping[str, Any]],
    groups: Sequence[Mapping[str, Any]],
    check_sizes: bool = True,
    held_outside_groups: Mapping[str, Any] | None = None,
) -> list[dict]:
    """``saved_groups`` for an optimizer whose own param groups are ``groups``: each with the saved ``params`` and
    the saved values of the hyperparameters the optimizer has, its own values for those it has and the saved run's
    optimizer had not. With ``check_sizes`` (where ``groups`` hold all their parameters, not one process's share),
    each saved group must list as many parameters as the optimizer's: a loader would leave the others untrained.

    A saved setting the optimizer has no key for is dropped, with a warning where the optimizer then behaves
    otherwise: a setting it lacks counts as off (``amsgrad=True`` and ``bias_correction=False`` are warned of)
    unless it always applies it (bias correction) or ``held_outside_groups`` gives its value, held by an attribute
    of its own (HybridAdam's ``adamw_mode`` as ``{"decoupled_weight_decay": True}``). Implementation keys
    (``foreach``, ``fused``) and how decay is applied where there is none are not warned of."""
    if len(saved_groups) != len(groups):
        raise CheckpointError(
            f"The checkpoint's optimizer has {len(saved_groups)} param group(s) and this run's {len(groups)}: "
            "configure_optimizers must build the param groups the saved run had."
        )
    sizes = [
        (len(saved.get("params", [])), len(group["params"])) for saved, group in zip(saved_groups, groups, strict=True)
    ]
    if check_sizes and any(saved != own for saved, own in sizes):
        raise CheckpointError(
            f"The checkpoint's optimizer trains {[saved for saved, _ in sizes]} parameters by param group and this "
            f"run's {[own for _, own in sizes]}: resume with the model and configure_optimizers that saved it."
        )
    _warn_of_dropped_settings(saved_groups, groups, held_outside_groups or {})
    return [
        {
            **{key: value for key, value in group.items() if key != "params"},
            **{key: value for key, value in saved.items() if key in group and key != "params"},
            "params": list(saved.get("params", [])),
        }
        for saved, group in zip(saved_groups, groups, strict=True)
    ]


def _warn_of_dropped_settings(
    saved_groups: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]], held: Mapping[str, Any]
) -> None:
    # An optimizer without a setting behaves as if it were off, unless it always applies it or holds it elsewhere.
    behaves = {**_ALWAYS_APPLIED, **held}
    dropped = {
        key: value
        for saved, group in zip(saved_groups, groups, strict=True)
        for key, value in saved.items()
        if key not in group and key != "params" and key not in _IMPLEMENTATION_KEYS
        and behaves.get(key, False) != value and not _moot(key, saved)
    }  # fmt: skip
    if dropped:
        settings = ", ".join(f"{key}={value!r}" for key, value in sorted(dropped.items()))
        rank_zero_warn(
            f"The checkpoint's optimizer was built with {settings}, which this run's optimizer has no setting for: "
            "it trains on as its own settings say. Build the optimizer the saved run had (the same class and "
            "settings) to train as it did.",
            category=UserWarning,
        )


def _moot(key: str, saved: Mapping[str, Any]) -> bool:
    """Whether a dropped setting changes nothing: how weight decay is applied, where there is none."""
    return key == "decoupled_weight_decay" and not saved.get("weight_decay")
