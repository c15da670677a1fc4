"""ZeRO-3 with the optimizer offloaded: each gradient accumulates where its optimizer step reads it.

With any optimizer offload, DeepSpeed 0.19.8's ZeRO-3 gives every parameter of the model a 16-bit gradient slot
in one host buffer (``grad_partitions_flat_buffer``, pageable unless ``pin_memory``). Each backward then copies
every gradient to the host and, for the norm and for the sub-groups whose optimizer stays on the GPU, back again;
and the host holds 2 bytes per parameter of the whole model beside the fp32 gradients of the offloaded share.
Measured on an H200: with 45% of a 10.6B GPT's optimizer offloaded, 16 bytes per offloaded parameter plus 2 per
parameter of the model was the host memory found, and forward with backward took 0.39 s a sequence.

Here the sub-groups whose optimizer stays on the GPU accumulate straight into their fp32 gradient there, which
DeepSpeed keeps for the step anyway (so the GPU holds nothing more, and accumulates in fp32), and only the
offloaded sub-groups keep a 16-bit slot on the host, page-locked at its exact size where CUDA runs so that
backward's copies do not stall. That pinning does not follow ``pin_memory``, which is DeepSpeed's option for its
own host buffers (the offloaded master weights and moments); where CUDA refuses it, the strategy warns and keeps
these buffers pageable. DeepSpeed's ``offload_states()``, which rebuilds the slots from its one buffer, is not
supported with this; Lightning does not call it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch

from lightning_strategies.pinned import PinningError, pin_in_place

# DeepSpeed's per-parameter gradient slots, a name-mangled attribute of DeepSpeedZeroOptimizer_Stage3.
_SLOTS = "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"


@dataclasses.dataclass(frozen=True)
class GradientPlacement:
    """Where ZeRO-3's gradient slots went: elements kept with their fp32 gradient, elements on the host."""

    kept_elements: int
    host_elements: int
    replaced_elements: int  # the size of DeepSpeed's own all-parameter buffer, now freed
    pinned: bool  # the host slots and the offloaded fp32 gradients, all page-locked


def applies(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a ZeRO-3 optimizer with its states offloaded to host memory (not NVMe) and no
    fp16 loss scaling, whose overflow check reads DeepSpeed's one buffer."""
    return (
        hasattr(optimizer, _SLOTS)
        and bool(getattr(optimizer, "offload_optimizer", False))
        and not getattr(optimizer, "swap_optimizer", False)
        and optimizer.dtype != torch.float16
    )


def _pinned(pin: Callable[[], Any]) -> bool:
    """Run ``pin``; where CUDA refuses, warn and go on with pageable memory (slower copies, the same training)."""
    try:
        pin()
    except PinningError as error:
        # Every rank says so: each may have its own share and its own free memory.
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        warnings.warn(
            f"Rank {rank}: {error} Offloaded gradients stay in pageable memory, so each backward's copies to the "
            "host wait for the GPU. Raise the limit, or offload a smaller share (offload_optimizer=<ratio>).",
            stacklevel=2,
        )
        return False
    return True


def keep_gradients_with_their_optimizer(
    optimizer: Any, device: torch.device, pin: bool | None = None
) -> GradientPlacement | None:
    """Move ZeRO-3's gradient slots: into the fp32 gradient of each sub-group held on ``device`` (where backward
    produces gradients), and into one exact-size host buffer for the others, page-locked with the offloaded fp32
    gradients if ``pin`` (by default where ``device`` is a GPU). None where it does not apply."""
    if not applies(optimizer):
        return None
    slots: dict[int, torch.Tensor] = getattr(optimizer, _SLOTS)
    kept: list[tuple[Any, torch.Tensor]] = []
    hosted: list[Any] = []
    for index, group in enumerate(optimizer.fp16_groups):
        fp32_gradient = optimizer.fp32_partitioned_groups_flat[index].grad
        for parameter in group:
            if fp32_gradient.device.type == device.type:
                _, start, elements = optimizer.grad_position[optimizer.get_param_id(parameter)]
                kept.append((parameter, fp32_gradient.narrow(0, start, elements)))
            else:
                hosted.append(parameter)

    # Called before the first backward, when every slot holds zeros: DeepSpeed's buffer goes before the new one
    # is allocated, so that host memory never holds both.
    replaced, dtype = optimizer.grad_partitions_flat_buffer.numel(), optimizer.grad_partitions_flat_buffer.dtype
    optimizer.grad_partitions_flat_buffer = None
    slots.clear()
    pinned = device.type == "cuda" if pin is None else pin
    host_elements = sum(parameter.partition_numel() for parameter in hosted)
    host = torch.empty(host_elements, dtype=dtype)
    pinned = pinned and _pinned(lambda: pin_in_place(host))
    host.zero_()
    position = 0
    for parameter in hosted:
        slots[parameter.ds_id] = host.narrow(0, position, parameter.partition_numel())
        position += parameter.partition_numel()
    for parameter, slot in kept:
        slot.zero_()
        slots[parameter.ds_id] = slot
    if pinned:
        # The boundary copies the offloaded share's gradients into these fp32 tensors, which CPU Adam reads.
        offloaded = [group.grad for group in optimizer.fp32_partitioned_groups_flat if group.grad.device.type == "cpu"]
        pinned = _pinned(lambda: [pin_in_place(gradient) for gradient in offloaded])
    optimizer.grad_partitions_flat_buffer = host
    kept_elements = sum(slot.numel() for _, slot in kept)
    return GradientPlacement(kept_elements, host_elements, replaced, pinned)
