"""Initialising what was built without values (a meta-device model materialised with ``to_empty``) as its
construction would have: each layer's ``reset_parameters``, then Hugging Face's own initialisation of its models
(``PreTrainedModel._init_weights``: normal(0, 0.02) and the like, run after the layers are built), then PEFT's for
LoRA adapters (added after the model)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_strategies.errors import CapabilityError
from lightning_strategies.hugging_face.models import hugging_face_models

if TYPE_CHECKING:
    from torch import nn


def initialize(root: nn.Module, modules: list[nn.Module]) -> None:
    """Initialise ``modules`` of ``root`` as their construction would have: each one's own ``reset_parameters``,
    then Hugging Face's initialisation for the parts of ``transformers`` models among them (the library initialises
    its models itself, after building their layers), then PEFT's for LoRA adapters (added after the model). For
    tensors allocated without values: a meta-device model materialised with ``to_empty``."""
    import torch

    chosen = {id(module) for module in modules}
    with torch.no_grad():
        for module in modules:
            reset_parameters = getattr(module, "reset_parameters", None)
            if callable(reset_parameters) and _has_own_tensors(module):
                reset_parameters()
        for model in hugging_face_models(root):
            inside = [module for module in model.modules() if id(module) in chosen]
            if inside:
                _hugging_face_initialization(model, inside)
        for layer, reset in lora_layers(root):  # a LoRA layer holds no tensors itself: its adapters do
            if any(id(inner) in chosen for inner in layer.modules()):
                reset()


def _has_own_tensors(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))


def _hugging_face_initialization(model: Any, modules: list[nn.Module]) -> None:
    """``PreTrainedModel.initialize_weights`` for ``modules`` of ``model`` alone: it skips whatever is flagged
    initialised, so the flags of ``modules`` and of their ancestors go (a module built on the meta device is flagged:
    there was nothing to initialise; an ancestor's ``_init_weights`` may set its children's weights, as GPT-2's
    attention scales its output projection's) and every other module is flagged for the call, then restored."""
    targets = {id(module) for module in modules}
    for name, module in model.named_modules():
        if id(module) in targets:
            parts = name.split(".") if name else []
            targets.update(id(model.get_submodule(".".join(parts[:depth]))) for depth in range(len(parts)))
    saved: list[tuple[Any, Any]] = []
    for module in model.modules():
        tensors = (module, *module.parameters(recurse=False), *module.buffers(recurse=False))
        for item in tensors if id(module) in targets else (module,):
            saved.append((item, item.__dict__.get("_is_hf_initialized", _ABSENT)))
            if id(module) in targets:
                item.__dict__.pop("_is_hf_initialized", None)
            else:
                item._is_hf_initialized = True
    try:
        model.initialize_weights()
    finally:
        for item, value in saved:
            if value is _ABSENT:
                item.__dict__.pop("_is_hf_initialized", None)
            else:
                item._is_hf_initialized = value


_ABSENT = object()


def lora_layers(root: nn.Module) -> list[tuple[nn.Module, Callable[[], None]]]:
    """The PEFT LoRA layers of ``root``, each with what gives its adapters PEFT's initialisation (B zero, so the
    adapted model starts as the base model), with the ``init_lora_weights`` of its adapter's config."""
    settings: dict[str, Any] = {}
    for module in root.modules():
        for adapter, config in (getattr(module, "peft_config", None) or {}).items():
            settings.setdefault(adapter, getattr(config, "init_lora_weights", True))
    layers: list[tuple[nn.Module, Callable[[], None]]] = []
    for module in root.modules():
        reset = getattr(module, "reset_lora_parameters", None)
        adapters = getattr(module, "lora_A", None)
        if callable(reset) and adapters is not None:
            _refuse_weight_dependent_starts(module, list(adapters), settings)
            layers.append((module, functools.partial(_reset_adapters, reset, list(adapters), settings)))
    return layers


def _refuse_weight_dependent_starts(layer: nn.Module, adapters: list[str], settings: dict[str, Any]) -> None:
    """DoRA's magnitudes and PiSSA-like starts are computed from the base weights as the adapter is built: inside
    configure_model those are placeholders, read from the file only later, so the adapter would start from nothing."""
    for adapter in adapters:
        start = settings.get(adapter, True)
        if (getattr(layer, "use_dora", None) or {}).get(adapter) or start not in (True, False, "gaussian"):
            what = "use_dora=True" if start in (True, False, "gaussian") else f"init_lora_weights={start!r}"
            raise CapabilityError(
                f"PEFT's {what} computes the adapter's starting values from the base model's weights as it is built; "
                "a sharding strategy builds the model in configure_model without them (they are read into the "
                "shards later), so the adapter would start from placeholders. Use LoRA with init_lora_weights=True "
                "or 'gaussian' under fsdp and deepspeed_stage_3, or train with strategy='ddp'. A trained adapter of "
                "this kind, loaded from its folder, is built the same way: merge it into its base model with "
                "strategy='ddp' (merge_and_unload, then save_pretrained) and fine-tune that."
            )


def _reset_adapters(reset: Callable[[str, Any], None], adapters: list[str], settings: dict[str, Any]) -> None:
    for adapter in adapters:
        reset(adapter, settings.get(adapter, True))


def move_buffers(root: nn.Module, device: Any) -> None:
    """Every buffer of ``root`` to ``device``, parameters left where their strategy keeps them: a model materialised
    with its parameters in host memory (offloaded) or as partitions computes with its buffers on the device."""
    for module in root.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)
