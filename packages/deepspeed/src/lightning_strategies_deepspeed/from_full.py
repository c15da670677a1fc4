"""DeepSpeed's universal layout written from one full Lightning checkpoint file (``lightning-strategies convert --to
deepspeed``), so that a run saved by ``ddp`` or ``fsdp`` goes on under ZeRO (stages 1, 2 and 3) with its Adam moments.

The universal layout keeps each parameter's fp32 value and Adam states by parameter name (``zero/<name>/fp32.pt``,
``exp_avg.pt``, ``exp_avg_sq.pt``, ``step.pt``), which DeepSpeed loads on any number of processes; a full file keeps
the same by parameter name (FSDP2's) or by position (torch's). Only what maps exactly is written: one torch Adam-type
optimizer whose every parameter has its moments, and a model whose every entry is such a parameter (DeepSpeed's
universal load restores parameters alone, so buffers and frozen weights would be lost). Anything else is refused with
what to do instead.
"""

from __future__ import annotations

import os
import shutil
from collections import OrderedDict
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import keyed_by_name, load_file, staged_save
from lightning_strategies_deepspeed.checkpoint import (
    _RANK_0_MODEL_STATES,
    ADAM_STATES,
    STAGE_3_OPTIMIZER_STATE,
    TAG,
    UNIVERSAL_SUFFIX,
    _client_state,
)

_INSTEAD = (
    "To go on under DeepSpeed from it, write its weights alone (`lightning-strategies convert {path} weights.ckpt "
    "--to full --drop-optimizer-states`) and resume from that file with DeepSpeedStrategy(load_full_weights=True): "
    "the optimizer starts afresh."
)


def from_full_checkpoint(
    source: str | os.PathLike[str], destination: str | os.PathLike[str], weights_only: bool | None = None
) -> Path:
    """The ``from_full_checkpoint`` of the DeepSpeed format: a universal checkpoint folder at ``destination`` that
    the deepspeed strategies (ZeRO stages 1, 2 and 3) resume with the weights, Adam moments and steps, schedulers and
    loop state of the full Lightning checkpoint file ``source``."""
    source, destination = Path(source), Path(destination)
    # Mapped, not read: each tensor is written out from the file's pages, so host memory need not hold the model.
    checkpoint = load_file(source, weights_only, map_location="cpu", mmap=True)
    return universal_from_full(checkpoint, source, destination)


def universal_from_full(checkpoint: Any, source: Path, destination: Path) -> Path:
    """``from_full_checkpoint`` of a full checkpoint already read (mapped) from ``source``: the Trainer's layout,
    ``state_dict`` and ``optimizer_states`` beside the rest."""
    state_dict = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state_dict, dict) or not state_dict:
        raise CheckpointError(f"{source} has no 'state_dict' entry, so it is no Trainer checkpoint of a model.")
    groups, states = _named_optimizer_state(source, checkpoint, state_dict)
    lost = [name for name in state_dict if name not in states]
    if lost:
        raise CheckpointError(
            f"{source} holds entries that its optimizer does not train ({', '.join(lost[:5])}"
            f"{', ...' if len(lost) > 5 else ''}: buffers or frozen weights), which DeepSpeed's universal layout does "
            f"not restore. {_INSTEAD.format(path=source)}"
        )
    rest = {key: value for key, value in checkpoint.items() if key not in ("state_dict", "optimizer_states")}
    universal_tag = TAG + UNIVERSAL_SUFFIX
    destination.parent.mkdir(parents=True, exist_ok=True)
    with staged_save(destination) as staged:
        tag_folder = staged / universal_tag / "zero"
        for name, state in states.items():
            folder = tag_folder / name
            folder.mkdir(parents=True)
            parameter = state_dict[name].detach().float()
            torch.save({"cat_dim": 0, "param": parameter}, folder / "fp32.pt")
            for key in ADAM_STATES:
                torch.save({"cat_dim": 0, "param": state[key].detach().float()}, folder / f"{key}.pt")
            torch.save(torch.tensor(float(state["step"])), folder / "step.pt")
        ds_version = version("deepspeed")
        # DeepSpeed's global optimizer state: its version and the param groups' hyperparameters, in the optimizer's
        # order; the loss scale and clipping stay as the resuming engine has them.
        hyperparameters = [{key: value for key, value in group.items() if key != "params"} for group in groups]
        steps = {float(state["step"]) for state in states.values()}
        torch.save(
            {
                "ds_version": ds_version,
                "param_groups": [{**group, "params": [index]} for index, group in enumerate(hyperparameters)],
                # ZeRO stage 3 reads one step and one group's hyperparameters for all: written only where those are
                # one (else stage 3 cannot resume the folder; stages 1 and 2 read each group's).
                **(
                    {
                        STAGE_3_OPTIMIZER_STATE: {
                            "state": {0: {"step": torch.tensor(steps.pop())}},
                            "param_groups": hyperparameters[:1],
                        }
                    }
                    if len(steps) == 1 and all(group == hyperparameters[0] for group in hyperparameters)
                    else {}
                ),
            },
            tag_folder / "optimizer_state.pt",
        )
        model_states = {
            "module": OrderedDict((name, tensor.detach().float()) for name, tensor in state_dict.items()),
            "buffer_names": [],
            "param_shapes": [OrderedDict((name, state_dict[name].shape) for name in group_names) for group_names in
                             (group["params"] for group in groups)],
            "frozen_param_shapes": OrderedDict(),
            "shared_params": {},
            "frozen_param_fragments": OrderedDict(),
            "optimizer": None,
            "lr_scheduler": None,
            "data_sampler": None,
            "random_ltd": None,
            "skipped_steps": 0,
            "global_steps": int(checkpoint.get("global_step", 0)),
            "dp_world_size": 1,
            "mp_world_size": 1,
            "ds_version": ds_version,
            **_client_state(rest),
        }  # fmt: skip
        # Stage 1 and 2 read the first name, stage 3 the second: one file under both names, written once (the whole
        # module, twice its size in writes otherwise). A link is safe as nothing writes into either in place later,
        # which would change both: saves and conversions write new files into a staged folder.
        written, linked = (staged / universal_tag / name for name in _RANK_0_MODEL_STATES)
        torch.save(model_states, written)
        try:
            os.link(written, linked)
        except OSError:  # a file system without hard links (FAT, some network and FUSE mounts)
            shutil.copyfile(written, linked)
        (staged / "latest_universal").write_text(universal_tag)
    return destination


def _named_optimizer_state(
    source: Path, checkpoint: dict[str, Any], weights: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The optimizer's param groups (``params`` as parameter names) and each parameter's states by name."""
    optimizers = checkpoint.get("optimizer_states") or []
    if len(optimizers) != 1:
        raise CheckpointError(
            f"{source} holds {len(optimizers)} optimizer states; DeepSpeed trains with exactly one optimizer. "
            + _INSTEAD.format(path=source)
        )
    (optimizer,) = optimizers
    named = keyed_by_name(optimizer, weights)
    if named is None:
        count = sum(len(group.get("params", [])) for group in optimizer.get("param_groups") or [])
        raise CheckpointError(
            f"{source} keeps its optimizer states by position for {count} of its {len(weights)} state_dict entries, "
            "and which state is which parameter's is not recorded (the other entries are buffers or frozen weights, "
            "or several param groups number the parameters in another order than the state_dict's). "
            + _INSTEAD.format(path=source)
        )
    states: dict[str, dict[str, Any]] = {}
    for name in (name for group in named["param_groups"] for name in group["params"]):
        state = named["state"].get(name)
        if not isinstance(state, dict) or not all(entry in state for entry in (*ADAM_STATES, "step")):
            raise CheckpointError(
                f"{source} has no Adam moments (exp_avg, exp_avg_sq, step) for {name}: DeepSpeed's universal layout "
                f"carries Adam-type states of parameters that have taken a step. {_INSTEAD.format(path=source)}"
            )
        if name not in weights:
            raise CheckpointError(f"{source} holds optimizer states for {name}, which its state_dict lacks.")
        states[name] = state
    return named["param_groups"], states
