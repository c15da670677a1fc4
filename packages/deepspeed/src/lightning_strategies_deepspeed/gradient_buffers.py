"""ZeRO-3 with the optimizer offloaded: each gradient accumulates where its optimizer step reads it.

With any optimizer offload, DeepSpeed 0.19.8's ZeRO-3 gives every parameter of the model a 16-bit gradient slot
in one host buffer (``grad_partitions_flat_buffer``, pageable unless ``pin_memory``). Each backward then copies
every gradient to the host and, for the norm and for the sub-groups whose optimizer stays on the GPU, back again;
and the host holds 2 bytes per parameter of the whole model beside the fp32 gradients of the offloaded share.
Measured on an H200: with 45% of a 10.6B GPT's optimizer offloaded, 16 bytes per offloaded parameter plus 2 per
parameter of the model was the host memory found, and forward with backward took 0.39 s a sequence.

Here the sub-groups whose optimizer stays on the GPU accumulate straight into their fp32 gradient there, which
DeepSpeed keeps for the step anyway (so the GPU holds nothing more, and accumulates in fp32). The offloaded
sub-groups get one of three:

- by default a 16-bit slot each, in one host buffer of their exact size, page-locked where CUDA runs so that
  backward's copies do not stall;
- with ``offloaded_gradients_in_fp32``, their fp32 gradient in host memory, which CPU Adam reads: no 16-bit copy
  beside it, so 2 bytes a parameter less host memory, and fp32 accumulation. DeepSpeed accumulates a host
  gradient by copying it to the GPU, adding and copying it back, so this moves 4 bytes a parameter each way
  instead of 2. Measured on an H200 with half of a 2.7B GPT's optimizer offloaded and 8 micro-batches a step
  (docs/which-strategy.md): 2.8 GiB less host memory, and 0.91 of the throughput (medians of three runs each).
  The plan sets it only where host memory is short.

- with ``offloaded_gradients_on_gpu``, a slot each in one buffer of the working precision on the training device,
  where backward adds each micro-batch's gradient; DeepSpeed copies it into the fp32 gradient on the host once, at
  the last micro-batch of the optimizer step. 2 bytes a parameter of GPU memory with bf16, for no host slot and
  one copy a step instead of two every micro-batch.

The offloaded fp32 gradients are page-locked as well. That pinning does not follow ``pin_memory``, which is
DeepSpeed's option for its own host buffers (the offloaded master weights and moments); where CUDA refuses it,
the strategy warns and keeps these buffers pageable. DeepSpeed's ``offload_states()``, which rebuilds the slots
from its one buffer, is not supported with this; Lightning does not call it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch

from lightning_strategies.pinned import PinningError, pin_in_place

# DeepSpeed's per-parameter gradient slots, a name-mangled attribute of DeepSpeedZeroOptimizer_Stage3.
_STAGE_3 = "DeepSpeedZeroOptimizer_Stage3"
_SLOTS = f"_{_STAGE_3}__param_id_to_grad_partition"


@dataclasses.dataclass(frozen=True)
class GradientPlacement:
    """Where ZeRO-3's gradient slots went: elements kept with their fp32 gradient on the training device, elements
    on the host (in their fp32 gradients, or in a 16-bit buffer)."""

    kept_elements: int
    host_elements: int
    replaced_elements: int  # the size of DeepSpeed's own all-parameter buffer, now freed
    host_in_fp32: bool
    pinned: bool  # the host slots and the offloaded fp32 gradients, all page-locked
    device_elements: int = 0  # offloaded, accumulating on the training device until the step


def applies(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a ZeRO-3 optimizer with its states offloaded to host memory (not NVMe) and no
    fp16 loss scaling, whose overflow check reads DeepSpeed's one buffer. Where such an optimizer lacks the slots
    this module replaces (a DeepSpeed that renamed them), it warns and says False: DeepSpeed's own buffer stays."""
    wanted = (
        any(cls.__name__ == _STAGE_3 for cls in type(optimizer).__mro__)
        and bool(getattr(optimizer, "offload_optimizer", False))
        and not getattr(optimizer, "swap_optimizer", False)
        and optimizer.dtype != torch.float16
    )
    if wanted and not hasattr(optimizer, _SLOTS):
        warnings.warn(_missing_slots_message(), stacklevel=2)
        return False
    return wanted


def _missing_slots_message() -> str:
    from importlib.metadata import version

    return (
        f"DeepSpeed {version('deepspeed')}'s {_STAGE_3} has no {_SLOTS.removeprefix(f'_{_STAGE_3}')} attribute, which "
        "lightning_strategies_deepspeed/gradient_buffers.py replaces (checked up to DeepSpeed 0.19.8). Training goes "
        "on with DeepSpeed's own host buffer: 2 bytes per parameter of the whole model more host memory, each "
        "gradient copied to the host and back every backward, and offloaded_gradients_in_fp32 and _on_gpu have no "
        "effect. "
        "Use deepspeed<=0.19.8 to keep them, or report the version."
    )


def _pinned(pin: Callable[[], Any]) -> bool:
    """Run ``pin``; where CUDA refuses, warn and go on with pageable memory (slower copies, the same training)."""
    try:
        pin()
    except PinningError as error:
        # Every rank says so: each may have its own share and its own free memory.
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        warnings.warn(
            f"Rank {rank}: {error} Offloaded gradients stay in pageable memory, so their copies to the host wait "
            "for the GPU. Raise the limit, or offload a smaller share (offload_optimizer=<ratio>).",
            stacklevel=2,
        )
        return False
    return True


def keep_gradients_with_their_optimizer(
    optimizer: Any,
    device: torch.device,
    pin: bool | None = None,
    in_fp32: bool = False,
    accumulate_on: torch.device | None = None,
) -> GradientPlacement | None:
    """Move ZeRO-3's gradient slots: into the fp32 gradient of each sub-group held on ``device`` (where backward
    produces gradients), and for the others into one exact-size buffer of DeepSpeed's accumulation dtype on
    ``accumulate_on`` if given (``in_fp32`` then has no effect), else into their fp32 gradients on the host if
    ``in_fp32``, else into one exact-size host buffer of that dtype. Host memory is page-locked if ``pin`` (by
    default where ``device`` is a GPU). None where it does not apply."""
    if not applies(optimizer):
        return None
    slots: dict[int, torch.Tensor] = getattr(optimizer, _SLOTS)
    in_fp32_gradient: list[tuple[Any, torch.Tensor]] = []
    hosted: list[Any] = []
    kept_elements = 0
    for index, group in enumerate(optimizer.fp16_groups):
        fp32_gradient = optimizer.fp32_partitioned_groups_flat[index].grad
        kept = fp32_gradient.device.type == device.type
        for parameter in group:
            _, start, elements = optimizer.grad_position[optimizer.get_param_id(parameter)]
            if kept or (in_fp32 and accumulate_on is None):
                in_fp32_gradient.append((parameter, fp32_gradient.narrow(0, start, elements)))
                kept_elements += elements if kept else 0
            else:
                hosted.append(parameter)

    # Called before the first backward, when every slot holds zeros: DeepSpeed's buffer goes before the new one
    # is allocated, so that host memory never holds both.
    replaced, dtype = optimizer.grad_partitions_flat_buffer.numel(), optimizer.grad_partitions_flat_buffer.dtype
    optimizer.grad_partitions_flat_buffer = None
    slots.clear()
    pinned = device.type == "cuda" if pin is None else pin
    elements = sum(parameter.partition_numel() for parameter in hosted)
    if accumulate_on is not None:
        buffer = torch.zeros(elements, dtype=dtype, device=accumulate_on)
    else:
        buffer = torch.empty(elements, dtype=dtype)
        pinned = pinned and _pinned(lambda: pin_in_place(buffer))
        buffer.zero_()
    position = 0
    for parameter in hosted:
        slots[parameter.ds_id] = buffer.narrow(0, position, parameter.partition_numel())
        position += parameter.partition_numel()
    for parameter, slot in in_fp32_gradient:
        slots[parameter.ds_id] = slot.zero_()
    if pinned:
        # Backward's copies (in_fp32) or the boundary's (from the 16-bit slots) write the offloaded share's
        # gradients into these fp32 tensors, which CPU Adam reads.
        offloaded = [group.grad for group in optimizer.fp32_partitioned_groups_flat if group.grad.device.type == "cpu"]
        pinned = _pinned(lambda: [pin_in_place(gradient) for gradient in offloaded])
    optimizer.grad_partitions_flat_buffer = buffer
    device_elements = 0 if accumulate_on is None else elements
    host_elements = sum(slot.numel() for slot in slots.values()) - kept_elements - device_elements
    host_in_fp32 = in_fp32 and accumulate_on is None
    return GradientPlacement(kept_elements, host_elements, replaced, host_in_fp32, pinned, device_elements)


def describe(placement: GradientPlacement, device: torch.device) -> str:
    """One line for the log: where each share of ZeRO-3's gradients accumulates."""
    where = [f"{placement.kept_elements:,} elements accumulate in fp32 beside their optimizer on {device.type}"]
    if placement.device_elements:
        where.append(
            f"{placement.device_elements:,} in a buffer of the working precision on {device.type}, copied to their "
            "fp32 gradients on the host once an optimizer step"
        )
    if placement.host_elements:
        kind = "in their fp32 gradients" if placement.host_in_fp32 else "in a buffer of the working precision"
        where.append(f"{placement.host_elements:,} on the host ({kind}{', pinned' if placement.pinned else ''})")
    return f"ZeRO-3 gradients: {', '.join(where)}, in place of one host buffer for all {placement.replaced_elements:,}"


def accumulation_hint(placement: GradientPlacement, micro_batches: int, element_bytes: int) -> str | None:
    """What to try where the offloaded share's gradients travel to the host and back every micro-batch of a step:
    None where they do not (one micro-batch a step, or none on the host)."""
    if micro_batches < 2 or not placement.host_elements:
        return None
    cost = placement.host_elements * element_bytes / 2**30
    return (
        f"ZeRO-3 copies the offloaded share's gradients to the host and back at each of the {micro_batches} "
        "micro-batches of an optimizer step. DeepSpeedStrategy(offloaded_gradients_on_gpu=True) keeps them on the "
        f"GPU until the step, for {cost:.1f} GiB more GPU memory a process (13.1B on one H200: forward and "
        "backward 1.37x faster; docs/which-strategy.md)."
    )
