"""``transformers`` models built as ZeRO-3 partitions in ``configure_model``: Hugging Face's initialisation and
pretrained weights, written through gathered parameters.

Under ``zero.Init`` each layer is partitioned as soon as it is built, so what ``PreTrainedModel.post_init`` then
initialises (normal(0, 0.02) and the like) is each rank's empty placeholder: nothing. And ``from_pretrained`` inside
``configure_model`` builds the model there and leaves its weights to be read (core's ``hugging_face.pretrained``).
Both are done here, before the engine is built: a module's parameters are gathered, rank 0 initialises or reads
them, and DeepSpeed scatters the result back into the partitions. Modules compiled before the engine takes them
are warned of here too: they are what a user compiling a Hugging Face model's decoder layers brings.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from torch import nn

from lightning_strategies.hugging_face import lora_layers, models_initialized_later, move_buffers, pretrained_tensors

# How many elements are gathered at once to be written: about 1 GiB of fp32 per group.
GATHER_ELEMENTS = 2**28
# LoRA layers whose adapters are initialised: a later fit, validate or test of the same module leaves them be.
_finished: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def finish_partitioned_models(root: nn.Module, deepspeed: Any, rank: int, device: torch.device) -> None:
    """Initialise the ``transformers`` models of ``root`` built partitioned in ``configure_model``, as Hugging Face
    would have, zero their new LoRA adapters' B, then read the pretrained weights of those built by
    ``from_pretrained``; buffers go to ``device``."""
    if any(hasattr(parameter, "ds_id") for parameter in root.parameters()):
        # zero.Init creates floating-point tensors on the device, others (BERT's token_type_ids) where torch puts
        # them, and the engine moves nothing of a model built partitioned.
        move_buffers(root, device)
    for model in models_initialized_later(root):
        _initialize(model)
    with torch.no_grad():
        # PEFT zeroes each new adapter's B after building it: under ZeRO-3, an empty placeholder by then.
        for layer, reset in lora_layers(root):
            if _built_partitioned(layer):
                adapters = [parameter for name, parameter in layer.named_parameters() if "lora_" in name]
                with deepspeed.zero.GatheredParameters(adapters, modifier_rank=0):
                    if rank == 0:
                        reset()
                _finished.add(layer)
        for group in _groups(pretrained_tensors(root)):
            parameters = list({id(tensor): tensor for tensor, _, _ in group if hasattr(tensor, "ds_id")}.values())
            with deepspeed.zero.GatheredParameters(parameters, modifier_rank=0):
                for tensor, weights, original in group:
                    if rank == 0 or not hasattr(tensor, "ds_id"):  # buffers are not partitioned: every rank
                        tensor.copy_(weights.read(original))


def _built_partitioned(module: nn.Module) -> bool:
    """Built under ``zero.Init`` (its parameters are partitions already) and not yet finished here."""
    return module not in _finished and any(hasattr(parameter, "ds_id") for parameter in module.parameters())


def _initialize(model: Any) -> None:
    """Hugging Face's initialisation of a partitioned model, skipped at construction, module by module on gathered
    parameters (the library's own ZeRO-3 variant of ``initialize_weights``)."""
    from transformers.integrations.deepspeed import initialize_weights_zero3

    initialize_weights_zero3(model)
    model.tie_weights()


def _groups(tensors: Iterator[tuple[Any, Any, str]]) -> Iterator[list[tuple[Any, Any, str]]]:
    """Consecutive tensors, up to ``GATHER_ELEMENTS`` a group, so one gather serves many small weights."""
    group: list[tuple[Any, Any, str]] = []
    elements = 0
    for item in tensors:
        size = int(getattr(item[0], "ds_numel", item[0].numel()))
        if group and elements + size > GATHER_ELEMENTS:
            yield group
            group, elements = [], 0
        group.append(item)
        elements += size
    if group:
        yield group


def warn_compiled_modules(root: nn.Module) -> None:
    """Warn that modules compiled before ZeRO-3 takes them run slower than uncompiled ones.

    DeepSpeed gathers and releases each module's parameters in hooks around its forward, and the parameters' state
    changes from one layer to the next: dynamo compiles the layer again for each, and past its recompile limit (8)
    runs the rest uncompiled. A Hugging Face Llama 8B whose decoder layers were compiled trained at 20,276 tokens/s
    on 4 x H200, against 31,804 to 35,193 uncompiled (docs/hugging-face.md).
    """
    # module.compile() sets _compiled_call_impl; torch.compile(module) wraps it in an OptimizedModule (_orig_mod).
    # Fabric's setup of a whole compiled model hands the strategy the module unwrapped and compiles it again
    # afterwards, out of sight here.
    compiled = [
        name
        for name, module in root.named_modules()
        if getattr(module, "_compiled_call_impl", None) is not None or hasattr(module, "_orig_mod")
    ]
    if compiled:
        rank_zero_warn(
            f"{len(compiled)} module(s) of the model are compiled ({compiled[0]!r} first): under ZeRO-3 DeepSpeed's "
            "parameter hooks make dynamo recompile them layer after layer, and they train slower than uncompiled "
            "(a Llama 8B on 4 H200s: 20,276 tokens/s against 31,804 to 35,193). Leave them uncompiled under "
            "deepspeed_stage_3, or compile them under the fsdp names, which shard compiled layers without "
            "recompiling.",
            category=UserWarning,
        )
