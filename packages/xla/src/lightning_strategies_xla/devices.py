"""Which XLA device kind this machine has and how many, decided from the machine alone.

Lightning 2.6 counts TPU cores with ``torch_xla._internal.tpu.num_available_devices()``, which
multiplies the PCI chip count by a cores-per-chip figure read from the GCE metadata server, so
even a machine without a TPU makes an HTTP request (that fails, or hangs where DNS does). Here
the PJRT device kind comes from ``PJRT_DEVICE`` (or torch_xla's own local choice), and only a
machine whose PCI bus shows TPU chips, a TPU VM, ever asks torch_xla for the TPU layout.
"""

from __future__ import annotations

import os
from types import ModuleType

from lightning_strategies.backends import require_backend

DISTRIBUTION = "lightning-strategies-xla"


def import_torch_xla() -> ModuleType:
    """torch_xla itself, or an error with the supported range and the install line."""
    return require_backend(
        "torch_xla",
        backend_distribution="torch_xla",
        strategy_distribution=DISTRIBUTION,
        install_hint="pip install 'torch_xla==2.9.0' 'torch==2.9.0'",
    )


def tpu_chips_on_this_host() -> int:
    """TPU chips on this host's PCI bus (a local file scan; no network)."""
    import_torch_xla()
    from torch_xla._internal import tpu

    return tpu.num_available_chips()


def device_kind() -> str | None:
    """The PJRT device kind: PJRT_DEVICE if set, else TPU where the PCI bus shows TPU chips, else None.

    torch_xla's own default (PJRT_DEVICE=CPU on any machine without a TPU, set when torch_xla is
    imported) is not followed: PJRT's CPU device is used only where someone asked for it.
    """
    requested = os.environ.get("PJRT_DEVICE")
    if requested and requested != _defaults_seen.get("PJRT_DEVICE"):
        return requested.split("_")[0].upper()
    chips = tpu_chips_on_this_host()
    if not requested and os.environ.get("PJRT_DEVICE"):
        _defaults_seen["PJRT_DEVICE"] = os.environ["PJRT_DEVICE"]  # set by that first torch_xla import
    return "TPU" if chips > 0 else None


# Values torch_xla put in the environment itself, told apart from values a user set.
_defaults_seen: dict[str, str] = {}


def local_device_count() -> int:
    """XLA devices this host's processes can use; 0 where there are none or the kind is unknown."""
    kind = device_kind()
    if kind == "TPU":
        if tpu_chips_on_this_host() == 0:
            return 0  # PJRT_DEVICE=TPU on a machine without TPU chips: nothing to count, nothing to ask
        from torch_xla._internal import tpu

        # Only on a TPU VM: cores per chip depend on the TPU generation, which torch_xla reads
        # from the VM's metadata server (or from TPU_ACCELERATOR_TYPE with TPU_SKIP_MDS_QUERY=1).
        return tpu.num_available_devices()
    if kind == "CPU":
        return _positive_int_from_environment("CPU_NUM_DEVICES", default=1)
    if kind == "CUDA":
        import torch

        return _positive_int_from_environment("GPU_NUM_DEVICES", default=torch.cuda.device_count())
    return 0


def _positive_int_from_environment(variable: str, default: int) -> int:
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} must be a whole number of XLA devices, e.g. {variable}=1.") from None
    if value < 1:
        raise ValueError(f"{variable}={text!r} must be at least 1.")
    return value
