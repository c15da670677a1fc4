"""From any strategy's checkpoint back to a Hugging Face folder: config plus sharded safetensors, or a PEFT adapter.

Every strategy of this project records the ``transformers`` models of the LightningModule it saves (their class,
config and, for a PEFT model, its adapter config) under ``checkpoint["hugging_face"]``, so ``export`` needs nothing
but the checkpoint. For a checkpoint saved without that record (Lightning's own strategies), pass ``config=``: a
folder holding the model's ``config.json``, such as the one it was loaded from.

The checkpoint is read whole through the format's own reader (``CheckpointFormat.read_weights``), in one process
and without a GPU; the folder appears only once completely written.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from lightning_strategies.errors import CheckpointError
from lightning_strategies.hugging_face.models import is_hugging_face_model

RECORD_KEY = "hugging_face"


def record_models(checkpoint: dict[str, Any], module: Any, under: str = "") -> None:
    """Describe the ``transformers`` and PEFT models in ``module`` (a LightningModule, or a model Fabric saves) in
    ``checkpoint``, as JSON text (any checkpoint reader loads a string, ``weights_only`` ones included).

    Each model is recorded under its name in the saved weights: its attribute path in ``module``, after ``under``,
    the key a Fabric state gives the module (``"model"`` for ``fabric.save(path, {"model": model, ...})``).
    """
    if module is None or (RECORD_KEY in checkpoint and _record(checkpoint[RECORD_KEY]) is None):
        return  # a Fabric state's own entry of that name is the user's, left as it is
    described = recorded_models(checkpoint)
    inside = [prefix for prefix in described if prefix == under or prefix.startswith(f"{under}.")]
    for prefix, child in module.named_modules():
        peft_config = getattr(child, "peft_config", None)
        base = child.get_base_model() if peft_config is not None and hasattr(child, "get_base_model") else child
        if not (peft_config is not None or is_hugging_face_model(base)):
            continue
        name = ".".join(part for part in (under, prefix) if part)
        if any(name == outer or name.startswith(f"{outer}.") or not outer for outer in inside):
            continue  # a model within one already described (a LlamaModel inside LlamaForCausalLM)
        entry: dict[str, Any] = {"class": _transformers_class(base), "config": base.config.to_dict()}
        if peft_config is not None:
            entry["peft"] = {adapter: config.to_dict() for adapter, config in peft_config.items()}
        described[name] = entry
        inside.append(name)
    if described:
        checkpoint[RECORD_KEY] = json.dumps(described, default=_jsonable)


def recorded_models(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What ``record_models`` wrote in ``checkpoint``: each model's name in the saved weights, with its class, config
    and adapters (empty where none was recorded)."""
    return _record(checkpoint.get(RECORD_KEY, "{}")) or {}


def without_record(remainder: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """What a Fabric load returns of a checkpoint, less the record of its models (unless the user's ``state`` asked
    for an entry of that name): the record is ours, and Fabric's remainder is the user's."""
    if RECORD_KEY not in state and _record(remainder.get(RECORD_KEY)) is not None:
        remainder.pop(RECORD_KEY)
    return remainder


def _record(value: Any) -> dict[str, Any] | None:
    """The record ``record_models`` writes (JSON text of an object), or None for anything else."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _transformers_class(model: Any) -> str:
    """The model's ``transformers`` class: FSDP2 makes a sharded model's class a subclass (``FSDPLlamaForCausalLM``)."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith("transformers."):
            return cls.__name__
    return type(model).__name__


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
    return str(value)


def export(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    config: str | os.PathLike[str] | None = None,
    prefix: str | None = None,
    weights_only: bool | None = None,
    max_shard_size: str = "5GB",
) -> Path:
    """Write the ``transformers`` model saved in ``checkpoint`` as a Hugging Face folder at ``out`` (a new folder),
    which ``AutoModel*.from_pretrained(out)`` loads; a PEFT model is written as its adapter, which
    ``PeftModel.from_pretrained(base, out)`` loads. Returns ``out``.

    ``prefix`` picks the model where the LightningModule holds several (its attribute name, e.g. ``"model"``);
    ``config`` is a folder with ``config.json`` for checkpoints saved without a record of the model.
    """
    from lightning_strategies.checkpoints.convert import source_format

    source, out = Path(checkpoint), Path(out)
    if out.exists():
        raise CheckpointError(
            f"{out} exists already; export writes a new folder and overwrites nothing. Choose another path, or "
            "remove that one first."
        )
    found = source_format(source)
    if not found.read_weights:
        raise CheckpointError(
            f"{source} is {found.description}, which export cannot read. "
            f"{found.to_full_weights.format(path=source)}, then export that file."
        )
    module_name, function = found.read_weights.split(":")
    saved = getattr(importlib.import_module(module_name), function)(source, weights_only)
    state_dict = saved.get("state_dict") if "state_dict" in saved else _fabric_weights(saved)
    if not isinstance(state_dict, dict) or not state_dict:
        raise CheckpointError(
            f"{source} holds no 'state_dict' and no module's weights, so it is not a Lightning or Fabric checkpoint "
            "of a model."
        )
    records = recorded_models(saved)
    prefix, entry = _choose(source, records, prefix, config, state_dict)
    weights = (
        {key.removeprefix(f"{prefix}."): value for key, value in state_dict.items() if key.startswith(f"{prefix}.")}
        if prefix
        else dict(state_dict)
    )
    model = _skeleton(entry)
    _check_keys(source, prefix, model, weights)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(staging, state_dict=weights, max_shard_size=max_shard_size)
        staging.chmod(0o777 & ~_umask())  # mkdtemp's folder is its owner's alone; a model folder is not
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _fabric_weights(saved: dict[str, Any]) -> dict[str, Any]:
    """A Fabric checkpoint's modules' weights under one namespace, each behind the key it was saved with
    (``{"model": {"lm_head.weight": ...}}`` gives ``model.lm_head.weight``); optimizer states and other values hold
    more than tensors, and are left out."""
    import torch

    return {
        f"{key}.{name}": tensor
        for key, value in saved.items()
        if isinstance(value, dict) and value and all(isinstance(item, torch.Tensor) for item in value.values())
        for name, tensor in value.items()
    }


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _choose(
    source: Path, records: dict[str, Any], prefix: str | None, config: Any, state_dict: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    if config is not None:
        from transformers import AutoConfig

        loaded = AutoConfig.from_pretrained(config)
        architectures = loaded.architectures or []
        if not architectures:
            raise CheckpointError(f"{config}'s config.json names no architecture; save the model's config there.")
        chosen = prefix if prefix is not None else _common_prefix(state_dict)
        return chosen, {"class": architectures[0], "config": loaded.to_dict()}
    if not records:
        raise CheckpointError(
            f"{source} has no record of a transformers model (it was saved by a strategy that keeps none). Pass "
            "config=<the folder the model was loaded from, with config.json> (--config on the command line)."
        )
    if prefix is None:
        if len(records) > 1:
            raise CheckpointError(
                f"{source} holds {len(records)} transformers models ({', '.join(records)}); pick one with prefix= "
                "(--prefix on the command line)."
            )
        prefix = next(iter(records))
    if prefix not in records:
        raise CheckpointError(f"{source} holds no transformers model at {prefix!r}; it holds {', '.join(records)}.")
    return prefix, records[prefix]


def _common_prefix(state_dict: dict[str, Any]) -> str:
    """The attribute all weights sit under (a LightningModule's ``self.model``), or none: the model's own names."""
    heads = {key.split(".", 1)[0] for key in state_dict}
    return heads.pop() if len(heads) == 1 else ""


def _skeleton(entry: dict[str, Any]) -> Any:
    """The recorded model built on the meta device: what ``save_pretrained`` needs besides the weights."""
    import torch
    import transformers

    model_class = getattr(transformers, entry["class"], None)
    if model_class is None:
        raise CheckpointError(
            f"transformers {transformers.__version__} has no class {entry['class']}; install the version the model "
            "was trained with."
        )
    config = model_class.config_class.from_dict(entry["config"])
    with torch.device("meta"):
        model = model_class._from_config(config)
        if "peft" in entry:
            import peft

            for adapter, settings in entry["peft"].items():
                adapter_config = peft.get_peft_config(settings)
                if isinstance(model, peft.PeftModel):
                    model.add_adapter(adapter, adapter_config)
                else:
                    model = peft.get_peft_model(model, adapter_config, adapter_name=adapter)
    return model


def _check_keys(source: Path, prefix: str, model: Any, weights: dict[str, Any]) -> None:
    tensors = model.state_dict(keep_vars=True)
    expected = set(tensors)
    # A tied weight (a head sharing the embeddings) may be saved under one of its names alone.
    first_name: dict[int, str] = {}
    tied = {name for name, tensor in tensors.items() if first_name.setdefault(id(tensor), name) != name}
    missing = sorted(expected - set(weights) - tied)
    unexpected = sorted(set(weights) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"the weights under {prefix!r} in {source} do not match the recorded model: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}. Pass the config the model was built with (config=), or the right prefix."
        )
