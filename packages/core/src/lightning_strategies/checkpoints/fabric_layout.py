"""One checkpoint file in the Trainer's layout or in Fabric's, for a strategy loading another's.

The Trainer saves the model under ``state_dict`` and its optimizers' states as the list ``optimizer_states``;
``fabric.save`` saves each object under the key the user gave it (``{"model": ..., "optimizer": ...}``). The one-file
forms of DeepSpeed's and ColossalAI's folders (``one_file_for``) are written in the Trainer's layout whoever saved
them (a DCP folder's keeps the keys it was saved with); a strategy that loads one for ``fabric.load`` reads it under
the user's keys, and one that converts a Fabric file reads it the other way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_strategies.errors import CheckpointError

TRAINER_KEYS = ("state_dict", "optimizer_states")


def saved_entry(saved: Any, key: str) -> Any:
    """What ``fabric.save`` wrote under ``key``, or a refusal naming the keys it did write."""
    if not isinstance(saved, dict) or key not in saved:
        found = sorted(map(str, saved)) if isinstance(saved, dict) else type(saved).__name__
        if isinstance(saved, dict) and TRAINER_KEYS[0] in saved and "pytorch-lightning_version" in saved:
            fix = "it is in the Trainer's layout: resume it with trainer.fit(model, ckpt_path=path)"
        else:
            fix = "load it with the keys it was saved with, fabric.load(path, {KEY: model, ...}) with KEY as saved"
        raise CheckpointError(f"The checkpoint has no {key!r} entry (it holds {found}): {fix}.")
    return saved[key]


def as_trainer_layout(saved: dict[str, Any], model_key: str, optimizer_key: str) -> dict[str, Any]:
    """A checkpoint ``fabric.save`` wrote, its model's weights under ``model_key`` and its optimizer's state under
    ``optimizer_key``, in the Trainer's layout; its other entries as they are."""
    weights, optimizer = saved_entry(saved, model_key), saved_entry(saved, optimizer_key)
    rest = {key: value for key, value in saved.items() if key not in (model_key, optimizer_key)}
    return {**rest, "state_dict": weights, "optimizer_states": [optimizer]}


def as_fabric_layout(saved: dict[str, Any], model_key: str, optimizer_keys: Sequence[str]) -> dict[str, Any]:
    """A checkpoint in the Trainer's layout under the keys of a ``fabric.load`` state: the weights under
    ``model_key``, the optimizers' states, in order, under ``optimizer_keys`` (those the file lacks left out, for the
    loader to refuse by name); its other entries as they are."""
    if not isinstance(saved, dict) or "state_dict" not in saved:
        return saved
    rest = {key: value for key, value in saved.items() if key not in TRAINER_KEYS}
    optimizers = dict(zip(optimizer_keys, saved.get("optimizer_states") or [], strict=False))
    return {**rest, model_key: saved["state_dict"], **optimizers}
