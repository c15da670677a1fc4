"""Page-locked host memory of exactly the size asked for, for offloading strategies.

Copies between the GPU and pageable host memory are synchronous, so an offloading backend whose backward copies
gradients into pageable buffers stalls on every copy. torch's own pinned allocator rounds each block up to a power
of two and caches it, which for buffers of gigabytes can nearly double the host memory they hold; these register
the memory with CUDA at its exact size instead.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

__all__ = ["PinningError", "pin_exactly", "pin_in_place"]


class PinningError(RuntimeError):
    """CUDA refused to page-lock host memory. The caller knows what its user can change, and says so."""


def pin_exactly(elements: int, dtype: Any) -> Any:
    """A new page-locked host tensor of exactly ``elements`` elements."""
    import torch

    tensor = torch.empty(elements, dtype=dtype)
    pin_in_place(tensor)
    return tensor


def pin_in_place(tensor: Any) -> bool:
    """Page-lock ``tensor``'s host memory where it lies; False when it was already pinned or holds nothing."""
    if tensor.numel() == 0 or tensor.is_pinned():
        return False
    import torch

    runtime = torch.cuda.cudart()
    error = runtime.cudaHostRegister(tensor.data_ptr(), tensor.nbytes, 0)
    if error != 0:
        _read_off_last_error()
        raise PinningError(
            f"CUDA could not page-lock {tensor.nbytes / 2**30:.2f} GiB of host memory (cudaHostRegister error "
            f"{error}): the host's locked-memory limit (ulimit -l) or its free memory is too small."
        )
    # Unregistered as the tensor goes, before its memory can be freed.
    weakref.finalize(tensor, runtime.cudaHostUnregister, tensor.data_ptr())
    return True


def _read_off_last_error() -> None:
    """CUDA keeps a failed call's error as the thread's last error until something reads it, and torch reads it
    after its next kernel launch, reporting it as that kernel's failure. One launch here reads it off, so that a
    caller that goes on without pinning is not stopped by it later."""
    import torch

    with contextlib.suppress(RuntimeError):  # the stale error, raised by torch's launch check, and so cleared
        torch.ones(1, device="cuda")
