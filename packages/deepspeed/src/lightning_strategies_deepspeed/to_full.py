"""One full Lightning checkpoint file from a ZeRO checkpoint folder, Adam moments included: the ``to_full_checkpoint``
of the DeepSpeed format, so that a run saved under ``deepspeed_stage_1/2/3`` goes on under ``ddp`` or ``fsdp`` with its
optimizer (by ``ckpt_path`` alone, or through ``lightning-strategies convert --to full|fsdp``).

ZeRO keeps each rank's slice of flat, padded optimizer buffers; DeepSpeed's universal layout (``ds_to_universal``)
already cuts them back into each parameter's whole fp32 value and Adam states, by parameter name. The folder is
converted into it once, in a scratch folder beside the output, and read from there: the weights, buffers and frozen
parameters as DeepSpeed's ``zero_to_fp32`` merges them, each trained parameter's ``exp_avg``, ``exp_avg_sq`` and step,
and the param groups' hyperparameters. The file keys the optimizer states by parameter name in the optimizer's order,
as FSDP2 writes them: torch's ``Optimizer.load_state_dict`` (``ddp``) maps them by that order, FSDP2 by name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import scratch_folder, staged_save
from lightning_strategies_deepspeed import checkpoint as checkpoints
from lightning_strategies_deepspeed import compatibility

_WEIGHTS_ALONE = (
    "For its weights and Lightning's state without the optimizer states: `lightning-strategies convert {path} "
    "weights.ckpt --to full --drop-optimizer-states`; to keep them, resume it under the deepspeed strategies."
)


def to_full_checkpoint(
    source: str | os.PathLike[str], destination: str | os.PathLike[str], weights_only: bool | None = None
) -> Path:
    """Write at ``destination`` one Lightning checkpoint holding everything the ZeRO checkpoint ``source`` resumes:
    the whole fp32 weights, the Adam moments and steps by parameter name, schedulers and loop state."""
    destination = Path(destination)
    location = checkpoints.locate(source)
    compatibility.check_saved_files(location.tag_folder)
    if location.universal:
        raise CheckpointError(
            f"{location.directory} is in DeepSpeed's universal layout, which is read under the deepspeed strategies "
            f"only. {_WEIGHTS_ALONE.format(path=source)}"
        )
    optimizer_file = checkpoints.optimizer_file_without_adam_state(location)
    if optimizer_file is not None:  # refused before ds_to_universal fails on it with a KeyError
        raise CheckpointError(
            f"{source}: the optimizer saved in {optimizer_file.name} keeps no Adam moments (exp_avg, exp_avg_sq: SGD, "
            f"Adagrad, ...), and one full file is written from DeepSpeed's universal layout, which carries those "
            f"alone. {_WEIGHTS_ALONE.format(path=source)}"
        )
    checkpoints.check_model_states_load(location, weights_only)
    client_state = checkpoints.read_saved_file(
        checkpoints.rank_0_model_states(location.tag_folder), weights_only, mmap=True
    )
    if (client_state.get("ds_config") or {}).get("zero_optimization", {}).get("round_robin_gradients"):
        # DeepSpeed then records its parameters shuffled, and torch's load_state_dict (ddp) pairs them by order.
        raise CheckpointError(
            f"{source} was saved with round_robin_gradients, whose order of parameters is not the model's, so their "
            f"states cannot be put in the model's order here. {_WEIGHTS_ALONE.format(path=source)}"
        )
    checkpoint = checkpoints.lightning_state(client_state)
    with scratch_folder(destination.parent) as scratch:
        universal = scratch / "universal"
        workers = max(1, min(os.cpu_count() or 1, 8))
        checkpoints.write_universal(location.tag_folder, universal, source, workers)
        # Weights and moments stay mapped from the files until written: host memory need not hold the model.
        checkpoint["state_dict"] = _whole_weights(location, universal, client_state, weights_only)
        checkpoint["optimizer_states"] = [_named_optimizer_state(universal, checkpoint["state_dict"], source)]
        with staged_save(destination) as staged:
            torch.save(checkpoint, staged)
    return destination


def _named_optimizer_state(universal: Path, weights: dict[str, torch.Tensor], source: Any) -> dict[str, Any]:
    """torch's optimizer state dict of the universal tag folder ``universal``, keyed by parameter name."""
    model_states = checkpoints.read_saved_file(checkpoints.rank_0_model_states(universal), weights_only=False)
    saved = torch.load(universal / "zero" / "optimizer_state.pt", map_location="cpu", weights_only=False)
    groups = saved["param_groups"]
    names = _names_by_group(model_states, groups, stage_3=checkpoints.STAGE_3_OPTIMIZER_STATE in saved)
    if len(names) != len(groups):
        raise CheckpointError(
            f"{source}: DeepSpeed recorded {len(names)} groups of parameter names for {len(groups)} optimizer param "
            f"groups, so which hyperparameters are whose is not known. {_WEIGHTS_ALONE.format(path=source)}"
        )
    stage_3_steps = _stage_3_steps(saved)
    state: dict[str, dict[str, torch.Tensor]] = {}
    for name in (name for group_names in names for name in group_names):
        folder = universal / "zero" / name
        shape = weights[name].shape
        entry = {key: _universal_tensor(folder / f"{key}.pt").reshape(shape) for key in checkpoints.ADAM_STATES}
        # Stages 1 and 2 keep each parameter's step beside its moments, stage 3 one step for all of them. Each
        # parameter gets a tensor of its own: torch's Adam increments its step in place, so one shared tensor would
        # count every parameter's steps.
        if stage_3_steps is None and not (folder / "step.pt").is_file():
            raise CheckpointError(
                f"{source}: DeepSpeed's universal conversion wrote no step count for {name} (its optimizer keeps "
                f"none per parameter), and torch's Adam needs one. {_WEIGHTS_ALONE.format(path=source)}"
            )
        step = torch.load(folder / "step.pt", weights_only=False) if stage_3_steps is None else stage_3_steps
        state[name] = {"step": torch.tensor(float(step)), **entry}
    param_groups = [{**group, "params": group_names} for group, group_names in zip(groups, names, strict=True)]
    return {"state": state, "param_groups": param_groups}


def _whole_weights(
    location: checkpoints.CheckpointLocation, universal: Path, client_state: dict[str, Any], weights_only: bool | None
) -> dict[str, torch.Tensor]:
    """The model's state dict as DeepSpeed's ``zero_to_fp32`` merges it (buffers, frozen parameters, trained parameters
    in fp32, tied parameters), from mapped files rather than merged in memory: each trained parameter's fp32 value from
    the universal folder, the rest from the saved model states."""
    buffer_names = set(client_state["buffer_names"])
    weights = {
        name: tensor.float() if tensor.is_floating_point() else tensor
        for name, tensor in client_state["module"].items()
        if name in buffer_names
    }
    weights.update(_frozen_parameters(location, client_state, weights_only))
    for shapes in client_state["param_shapes"]:
        for name, shape in shapes.items():
            weights[name] = _universal_tensor(universal / "zero" / name / "fp32.pt").reshape(shape)
    for name, tied_to in client_state["shared_params"].items():
        if tied_to in weights:
            weights[name] = weights[tied_to]
    return weights


def _frozen_parameters(
    location: checkpoints.CheckpointLocation, client_state: dict[str, Any], weights_only: bool | None
) -> dict[str, torch.Tensor]:
    """Parameters that took no optimizer step (frozen for a fine-tune), which the universal layout leaves out: at stages
    1 and 2 the saved module holds them whole (stage 1 records no frozen_param_shapes, so they are what it holds beside
    the trained parameters, buffers and tied names), at stage 3 every rank's model states hold a partition."""
    layout = compatibility.SavedLayout.of(location.tag_folder, client_state)
    if not layout.parameter_ranks:
        trained = {name for shapes in client_state["param_shapes"] for name in shapes}
        others = trained | set(client_state["buffer_names"]) | set(client_state["shared_params"])
        return {name: tensor for name, tensor in client_state["module"].items() if name not in others}
    shapes = client_state.get("frozen_param_shapes") or {}
    if not shapes:
        return {}
    ranks = [
        checkpoints.read_saved_file(
            location.tag_folder / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt", weights_only, mmap=True
        )["frozen_param_fragments"]
        for rank in layout.parameter_ranks
    ]
    return {
        name: torch.cat([fragments[name] for fragments in ranks]).narrow(0, 0, shape.numel()).view(shape)
        for name, shape in shapes.items()
    }


def _names_by_group(model_states: dict[str, Any], groups: list[dict[str, Any]], stage_3: bool) -> list[list[str]]:
    """The parameter names of each optimizer param group. DeepSpeed records them per group at stages 1 and 2, and at
    stage 3 per sub-group (its flat partitions, split at sub_group_size), which each group lists by position."""
    recorded = [list(shapes) for shapes in model_states["param_shapes"]]
    if not stage_3 or len(recorded) == len(groups):
        return recorded
    try:
        return [[name for index in group["params"] for name in recorded[index]] for group in groups]
    except (IndexError, KeyError, TypeError):
        return recorded  # refused by the caller: the groups cannot be told apart


def _universal_tensor(path: Path) -> torch.Tensor:
    """A state file of the universal layout: ``{"param": tensor, "cat_dim": ...}`` (stages 1 and 2) or the flat
    tensor itself (stage 3)."""
    loaded = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return (loaded["param"] if isinstance(loaded, dict) else loaded).float()


def _stage_3_steps(saved: dict[str, Any]) -> float | None:
    """Stage 3's one step count (its optimizer steps every partition together), or None for stages 1 and 2."""
    stage_3 = saved.get(checkpoints.STAGE_3_OPTIMIZER_STATE)
    if stage_3 is None:
        return None
    steps = {float(entry["step"]) for entry in stage_3["state"].values() if "step" in entry}
    if len(steps) != 1:
        raise CheckpointError(
            f"DeepSpeed's ZeRO stage 3 optimizer state holds {len(steps)} different step counts ({sorted(steps)}); "
            "one full checkpoint keeps one per parameter, and which is whose is not recorded."
        )
    return steps.pop()
