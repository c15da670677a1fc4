"""Optimizer states another strategy saved, in the layout GeminiOptimizer loads.

GeminiOptimizer numbers the parameters by their position in the optimizer's param groups and looks each state up
by that number, as torch's ``Optimizer.state_dict()`` does. FSDP2's checkpoints, and the one-file forms of
DeepSpeed's and FSDP2's folders, key the states by parameter name instead: given as they are, Gemini would restore
none, silently. Their param groups also carry torch Adam's hyperparameters, where HybridAdam reads its own
(``bias_correction``): core's ``adopted_param_groups`` takes the saved values of the keys HybridAdam has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import adopted_param_groups


def for_gemini(optimizer_state: Mapping[str, Any], gemini_optimizer: Any, module: torch.nn.Module) -> dict[str, Any]:
    """``optimizer_state`` (torch's layout, keyed by position or by name) as ``gemini_optimizer.load_state_dict``
    takes it, for the parameters of ``module`` that it trains."""
    # Gemini's own groups hold this process's share of the parameters; it numbers all of them in id_to_real_params.
    # HybridAdam decays weights as AdamW does by an attribute of its own, not a param group key.
    hybrid_adam = gemini_optimizer.optim
    saved_groups = adopted_param_groups(
        optimizer_state.get("param_groups") or [], hybrid_adam.param_groups, check_sizes=False,
        held_outside_groups={"decoupled_weight_decay": bool(getattr(hybrid_adam, "adamw_mode", False))},
    )  # fmt: skip
    keys = [key for group in saved_groups for key in group.get("params", [])]
    position = _positions_by_name(gemini_optimizer, module) if any(isinstance(key, str) for key in keys) else {}
    if len(keys) != len(gemini_optimizer.id_to_real_params):
        # Gemini drops from its groups any parameter the saved ones do not list: it would never be updated.
        raise CheckpointError(
            f"The checkpoint's optimizer trains {len(keys)} parameters and this run's "
            f"{len(gemini_optimizer.id_to_real_params)}: resume with the model and configure_optimizers that saved it."
        )
    unknown = [key for key in keys if isinstance(key, str) and key not in position]
    if unknown:
        raise CheckpointError(
            f"The checkpoint holds optimizer states for {', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}, "
            "which this model's optimizer does not train: resume with the model and optimizer that saved it."
        )
    return {
        "state": {
            position.get(key, key): {name: _as_tensor(value) for name, value in states.items()}
            for key, states in (optimizer_state.get("state") or {}).items()
        },
        "param_groups": [
            {**group, "params": [position.get(key, key) for key in group["params"]]} for group in saved_groups
        ],
    }


def _positions_by_name(gemini_optimizer: Any, module: torch.nn.Module) -> dict[str, int]:
    """Parameter name -> GeminiOptimizer's number for it (Gemini keeps the module's parameter objects)."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    return {
        names[id(parameter)]: number
        for number, parameter in gemini_optimizer.id_to_real_params.items()
        if id(parameter) in names
    }


def _as_tensor(value: Any) -> Any:
    # Gemini casts every state entry as a tensor; some writers keep Adam's step as a Python number.
    return torch.tensor(float(value)) if isinstance(value, (int, float)) else value
