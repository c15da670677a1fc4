"""ZeRO-3 with the optimizer offloaded: each gradient accumulates where its optimizer step reads it.

With any optimizer offload, DeepSpeed 0.19.8's ZeRO-3 gives every parameter of the model a 16-bit gradient slot
in one host buffer (``grad_partitions_flat_buffer``, pageable unless ``pin_memory``). Each backward then copies
every gradient to the host and, for the norm and for the sub-groups whose optimizer stays on the GPU, back again;
and the host holds 2 bytes per parameter of the whole model beside the fp32 gradients of the offloaded share.
Measured on an H200: with 45% of a 10.6B GPT's optimizer offloaded, 16 bytes per offloaded parameter plus 2 per
parameter of the model was the host memory found, and forward with backward took 0.39 s a sequence.

Here every parameter accumulates straight into the fp32 gradient of its sub-group, which DeepSpeed keeps for the
optimizer step anyway: on the GPU for the sub-groups whose optimizer stays there, in host memory for the offloaded
ones. Neither side then holds a 16-bit copy beside the fp32 gradient, and accumulation is in fp32 everywhere. The
cost is PCIe traffic: DeepSpeed accumulates a host gradient by copying it to the GPU, adding and copying it back,
which moves 4 bytes a parameter each way instead of 2. Measured on an H200 (docs/which-strategy.md): 2 bytes per
offloaded parameter less host memory, which is what lets the plan fit 13B, for a few percent of throughput.

The offloaded fp32 gradients are page-locked where CUDA runs, so that backward's copies do not stall. That pinning
does not follow ``pin_memory``, which is DeepSpeed's option for its own host buffers (the offloaded master weights
and moments); where CUDA refuses it, the strategy warns and keeps these buffers pageable. DeepSpeed's
``offload_states()``, which rebuilds the slots from its one buffer, is not supported with this; Lightning does
not call it.
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
    """Where ZeRO-3's gradients accumulate: elements in fp32 on the training device, elements in fp32 on the host."""

    kept_elements: int
    host_elements: int
    replaced_elements: int  # the size of DeepSpeed's own 16-bit all-parameter buffer, now freed
    pinned: bool  # the offloaded fp32 gradients are page-locked


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
    """Point each of ZeRO-3's gradient slots into the fp32 gradient of its sub-group, on ``device`` or on the host,
    and free DeepSpeed's 16-bit buffer; page-lock the host fp32 gradients if ``pin`` (by default where ``device``
    is a GPU). None where it does not apply."""
    if not applies(optimizer):
        return None
    slots: dict[int, torch.Tensor] = getattr(optimizer, _SLOTS)
    # Called before the first backward, when every slot holds zeros.
    replaced = optimizer.grad_partitions_flat_buffer.numel()
    optimizer.grad_partitions_flat_buffer = None
    slots.clear()
    elements = {"kept": 0, "host": 0}
    for index, group in enumerate(optimizer.fp16_groups):
        fp32_gradient = optimizer.fp32_partitioned_groups_flat[index].grad
        side = "kept" if fp32_gradient.device.type == device.type else "host"
        for parameter in group:
            _, start, count = optimizer.grad_position[optimizer.get_param_id(parameter)]
            slots[parameter.ds_id] = fp32_gradient.narrow(0, start, count).zero_()
            elements[side] += count
    pinned = device.type == "cuda" if pin is None else pin
    if pinned:
        # Backward copies the offloaded share's gradients into these fp32 tensors, which CPU Adam reads.
        offloaded = [group.grad for group in optimizer.fp32_partitioned_groups_flat if group.grad.device.type == "cpu"]
        pinned = _pinned(lambda: [pin_in_place(gradient) for gradient in offloaded])
    return GradientPlacement(elements["kept"], elements["host"], replaced, pinned)
