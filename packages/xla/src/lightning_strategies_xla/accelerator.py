"""An XLA accelerator that counts devices locally, so building a Trainer never calls the network.

It is Lightning's ``XLAAccelerator`` (so Lightning's checks pair it with XLA strategies and XLA
precision) with device discovery replaced by ``devices.py``. Pass it explicitly,
``Trainer(accelerator=XLAAccelerator(), strategy="single_xla")``, or construct one of this
package's strategies without an accelerator: they bring this one along.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from lightning.fabric.utilities.device_parser import _check_data_type
from lightning.pytorch.accelerators.xla import XLAAccelerator as LightningXLAAccelerator
from typing_extensions import override

from lightning_strategies_xla import devices


class XLAAccelerator(LightningXLAAccelerator):
    """XLA devices (TPU, or PJRT's CPU device with ``PJRT_DEVICE=CPU``) found without the metadata server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        devices.import_torch_xla()  # a missing torch_xla is reported with its install line
        super().__init__(*args, **kwargs)

    @staticmethod
    @functools.lru_cache(maxsize=1)  # xmp.spawn drops the device-count variables, so keep the first answer
    @override
    def auto_device_count() -> int:
        return devices.local_device_count()

    @staticmethod
    @functools.lru_cache(maxsize=1)
    @override
    def is_available() -> bool:
        return XLAAccelerator.auto_device_count() > 0

    @staticmethod
    @override
    def parse_devices(requested: int | str | list[int]) -> int | list[int]:
        """One device, all of them, or one device by index: what PJRT's process model allows."""
        available = XLAAccelerator.auto_device_count()
        parsed = _parse_device_request(requested)
        if isinstance(parsed, int) and parsed in {1, available}:
            return parsed
        if isinstance(parsed, list) and len(parsed) == 1 and 0 <= parsed[0] < available:
            return parsed
        shown = parsed if isinstance(requested, str) else requested  # as Lightning shows it
        raise ValueError(
            f"`devices` can only be 'auto', 1, {available} or [<0-{available - 1}>] for TPUs. Got {shown!r}. "
            f"devices={requested!r} cannot be used with {available} XLA device(s) "
            f"(PJRT_DEVICE={devices.device_kind()}): use 1, {available}, or a one-element list such as [0]."
        )

    @staticmethod
    @override
    def get_parallel_devices(requested: int | list[int]) -> list[torch.device]:
        # Placeholders only: the real XLA device exists once the worker processes run.
        parsed = XLAAccelerator.parse_devices(requested)
        if isinstance(parsed, int):
            return [torch.device("xla", index) for index in range(parsed)]
        return [torch.device("xla", parsed[0])]


def _parse_device_request(requested: int | str | list[int]) -> int | list[int]:
    try:
        _check_data_type(requested)  # Lightning's own check of the type (a bool is refused), in its words
    except TypeError as error:
        raise TypeError(
            f"{error} devices= takes a number of devices, a string like '1', or a list of device indices."
        ) from None
    if isinstance(requested, int):
        return requested
    if isinstance(requested, str):
        text = requested.strip()
        try:
            return int(text)
        except ValueError:
            try:
                return [int(part) for part in text.split(",") if part.strip()]
            except ValueError:
                raise ValueError(
                    f"Could not parse the selected TPU devices: {text!r}. devices={requested!r} is not a number of "
                    "devices or a list like '0'."
                ) from None
    return list(requested)
