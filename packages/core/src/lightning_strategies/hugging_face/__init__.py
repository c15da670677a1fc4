"""Hugging Face ``transformers`` models under the sharding strategies, one concern per module:

- ``pretrained``: ``from_pretrained`` inside ``configure_model`` builds the model in the strategy's init context and
  records where its weights are; the strategy reads each shard's part from the safetensors files.
- ``initialization``: what was built without values gets what its construction would have given it: each layer's
  ``reset_parameters``, Hugging Face's own initialisation, PEFT's for LoRA adapters.
- ``export``: any strategy's checkpoint back to a Hugging Face folder (or a PEFT adapter).

Importing this package imports neither torch nor ``transformers``.
"""

from lightning_strategies.hugging_face.export import export, record_models, recorded_models, without_record
from lightning_strategies.hugging_face.initialization import initialize, lora_layers, move_buffers
from lightning_strategies.hugging_face.models import hugging_face_models
from lightning_strategies.hugging_face.pretrained import (
    PretrainedWeights,
    deferred_pretrained_loading,
    load_pending,
    models_initialized_later,
    pretrained_tensors,
)

__all__ = [
    "PretrainedWeights",
    "deferred_pretrained_loading",
    "export",
    "hugging_face_models",
    "initialize",
    "load_pending",
    "lora_layers",
    "models_initialized_later",
    "move_buffers",
    "pretrained_tensors",
    "record_models",
    "recorded_models",
    "without_record",
]
