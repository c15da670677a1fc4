"""What GeminiDDP and GeminiOptimizer leave out of a checkpoint, so a resume continues exactly.

GeminiDDP gathers and scatters chunks for its state dicts in the training dtype: the fp32 master
weights of sharded or offloaded chunks are rounded to fp16/bf16 on save and the rounded values
become the master weights on load. GeminiOptimizer's state dict has no fp16 loss scaler, so a
resumed run starts again from the initial loss scale. And ColossalAI's C++ CPU Adam kernel keeps
``beta**t`` itself, outside any state dict (``replay_cpu_adam_kernel``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import torch

# Where the loss scaler's state is kept in Lightning's checkpoint, beside the optimizer states.
LOSS_SCALER_KEY = "colossalai_loss_scaler"


@contextlib.contextmanager
def fp32_chunk_transfers(gemini_model: Any) -> Generator[None, None, None]:
    """Within the block GeminiDDP's state-dict saving and loading move chunks in fp32.

    Its (de)serialisation reads the dtype of the temporary gathered chunk from ``mixed_precision``;
    nothing else runs in between, and the training dtype is put back afterwards.
    """
    training_dtype = gemini_model.mixed_precision
    gemini_model.mixed_precision = torch.float32
    try:
        yield
    finally:
        gemini_model.mixed_precision = training_dtype


def gathered_model_state(gemini_model: Any, rank_zero_only: bool, is_global_zero: bool) -> dict[str, Any]:
    """The full model state gathered from the chunks in fp32, on CPU; with ``rank_zero_only`` only rank 0
    gets the tensors (the others an empty dict), as GeminiDDP gathers them to rank 0 alone."""
    with fp32_chunk_transfers(gemini_model):
        state = gemini_model.state_dict(only_rank_0=rank_zero_only)
    if rank_zero_only and not is_global_zero:
        return {}
    # Plain tensors: buffers come back as ColossalAI's ColoTensor, which loading with weights_only=True refuses.
    return {
        key: value.detach().cpu().as_subclass(torch.Tensor) if isinstance(value, torch.Tensor) else value
        for key, value in state.items()
    }


def loss_scaler_state(gemini_optimizer: Any) -> dict[str, Any] | None:
    """The dynamic fp16 loss scaler in full (its own state_dict omits the step counters); None in bf16."""
    scaler = getattr(gemini_optimizer.mix_precision_mixin, "grad_scaler", None)
    if scaler is None:
        return None
    return {
        "scale": float(scaler.scale.item()),
        "growth_step": int(scaler._growth_step),
        "hysteresis_step": int(scaler._hysteresis_step),
    }


def load_loss_scaler_state(gemini_optimizer: Any, state: dict[str, Any] | None) -> None:
    """Put back what ``loss_scaler_state`` saved; a checkpoint without it keeps the fresh scaler."""
    scaler = getattr(gemini_optimizer.mix_precision_mixin, "grad_scaler", None)
    if scaler is None or state is None:
        return
    scaler.scale.fill_(state["scale"])
    scaler._growth_step = state["growth_step"]
    scaler._hysteresis_step = state["hysteresis_step"]


def replay_cpu_adam_kernel(optimizer: Any) -> None:
    """Leave ColossalAI's C++ CPU Adam kernel as the saved run's last step left it.

    The kernel (``cpu_adam.h``, ``IncrementStep``) keeps ``beta1**t`` and ``beta2**t``: within a step
    the first CPU parameter multiplies last step's value by beta and the others take ``pow``, which
    differ in the last float bit (about 1.5e-5 relative once in ``1 - beta2**t``). A fresh kernel after
    a resume takes ``pow`` for that first parameter, so the first resumed step differed from an
    uninterrupted run's (up to 6.8e-5 in the weights on an H200). Stepping the kernel on a zero
    one-element tensor, whose update is zero, at the restored step count restores its state.
    """
    kernel = getattr(optimizer, "cpu_adam_op", None)
    if kernel is None:
        return
    stepped = [
        (group, int(optimizer.state[parameter]["step"]))
        for group in optimizer.param_groups
        for parameter in group["params"]
        if parameter.device.type == "cpu" and "step" in optimizer.state.get(parameter, {})
    ]
    if not stepped or stepped[-1][1] == 0:
        return
    group, step = stepped[-1]  # the last CPU parameter stepped set the kernel's state
    beta1, beta2 = group["betas"]
    # With one CPU parameter every step multiplies, so its chain is replayed; otherwise its last step took pow.
    for replayed in range(1, step + 1) if len(stepped) == 1 else (step,):
        zeros = [torch.zeros(1) for _ in range(4)]  # weight, gradient and both moments: the update is zero
        kernel.step(replayed, group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                    group["bias_correction"], *zeros, -1)  # fmt: skip
