"""Importing DeepSpeed once the device is known, so it picks the accelerator Lightning uses.

``import deepspeed`` fixes DeepSpeed's accelerator for the life of the process (several of its
modules read it at import time), auto-detecting CUDA whenever a GPU is visible. A run on
``accelerator="cpu"`` therefore has to choose DeepSpeed's CPU accelerator before that import,
which is why the strategies import deepspeed only through ``import_deepspeed``.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from types import ModuleType

from lightning_strategies.backends import require_backend
from lightning_strategies_deepspeed.cuda_arch import normalize_environment

log = logging.getLogger(__name__)

ACCELERATOR_VARIABLE = "DS_ACCELERATOR"
# Lightning's device type -> DeepSpeed's accelerator name.
_DEEPSPEED_ACCELERATORS = {"cpu": "cpu", "cuda": "cuda"}


def import_deepspeed(device_type: str | None = None, logging_level: int | None = None) -> ModuleType:
    """Import deepspeed with its accelerator matching ``device_type`` ("cpu" or "cuda")."""
    wanted = _DEEPSPEED_ACCELERATORS.get(device_type or "")
    if device_type is not None and wanted is None:
        raise ValueError(
            f"DeepSpeed strategies run on CUDA GPUs or on CPU, not on {device_type!r}. "
            "Use Trainer(accelerator='cuda') or Trainer(accelerator='cpu')."
        )
    if wanted == "cuda":
        normalize_environment()
    if wanted is not None and "deepspeed" not in sys.modules:
        # Child processes (Lightning's launcher, DeepSpeed's op builds) inherit the choice.
        os.environ[ACCELERATOR_VARIABLE] = wanted
    deepspeed = require_backend(
        "deepspeed", backend_distribution="deepspeed", strategy_distribution="lightning-strategies-deepspeed"
    )
    if wanted is not None:
        _ensure_accelerator(wanted)
    if logging_level is not None:
        deepspeed.utils.logging.logger.setLevel(logging_level)
    return deepspeed


def _ensure_accelerator(wanted: str) -> None:
    from deepspeed.accelerator import get_accelerator, set_accelerator

    current = get_accelerator()
    if current.device_name() == wanted:
        return
    if wanted == "cpu":
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        replacement = CPU_Accelerator()
    else:
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

        replacement = CUDA_Accelerator()
    warnings.warn(
        f"deepspeed was imported before the strategy started and chose its {current.device_name()!r} accelerator; "
        f"switching it to {wanted!r}. If this fails, set {ACCELERATOR_VARIABLE}={wanted} before importing deepspeed.",
        RuntimeWarning,
        stacklevel=3,
    )
    set_accelerator(replacement)
