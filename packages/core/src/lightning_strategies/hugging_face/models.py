"""Telling ``transformers`` models apart without importing ``transformers`` where nothing else has."""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


def transformers_installed() -> bool:
    return importlib.util.find_spec("transformers") is not None


def is_hugging_face_model(module: Any) -> bool:
    """A ``transformers.PreTrainedModel`` (told without importing ``transformers`` where it is not imported)."""
    modeling = sys.modules.get("transformers.modeling_utils")
    return modeling is not None and isinstance(module, modeling.PreTrainedModel)


def hugging_face_models(root: nn.Module) -> list[nn.Module]:
    """The outermost ``PreTrainedModel`` instances in ``root`` (itself included)."""
    found: list[nn.Module] = []
    for module in root.modules():
        if is_hugging_face_model(module) and not any(module in outer.modules() for outer in found):
            found.append(module)
    return found
