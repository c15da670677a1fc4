"""The optimizer each run uses, built by one function so Trainer and by-hand runs cannot drift apart.

All are AdamW-style (decoupled weight decay 0.01, lr 1e-4): PyTorch's fused AdamW; DeepSpeed's
FusedAdam (GPU) or DeepSpeedCPUAdam (optimizer offloaded); ColossalAI's HybridAdam (which Gemini
requires; it updates on GPU or CPU wherever each chunk lives).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import torch

from tools.benchmark.measure import LEARNING_RATE

WEIGHT_DECAY = 0.01


def build(name: str, parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if name == "adamw_fused":
        return torch.optim.AdamW(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, fused=True)
    if name == "deepspeed_fused_adam":
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, adam_w_mode=True)
    if name == "deepspeed_cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, adamw_mode=True)
    if name == "hybrid_adam":
        from colossalai.nn.optimizer import HybridAdam

        return HybridAdam(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, adamw_mode=True)
    raise ValueError(
        f"Unknown optimizer {name!r}: choose adamw_fused, deepspeed_fused_adam, deepspeed_cpu_adam or hybrid_adam."
    )


def plain_cuda_architectures() -> None:
    """DeepSpeed 0.19's op builder cannot parse arch-specific entries such as "9.0a", which H100/H200
    images set in TORCH_CUDA_ARCH_LIST, and stops when it JIT-builds FusedAdam. Without our deepspeed
    package (by hand, Lightning's built-in strategy) a user must rewrite them first, so those runs do.
    Trainer runs are left alone: coping with it is the deepspeed package's job, and is measured."""
    value = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if value:
        os.environ["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d+\.\d+)a\b", r"\1", value)
