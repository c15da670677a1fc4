"""Where Lightning checks for its own XLA strategies by class, ours pass (issue 16): they subclass Lightning's.

Lightning's XLA classes import nothing of torch_xla at import time and take no version pin, so subclassing
is safe here. The places, with what Lightning does there, are listed in docs/lightning-compatibility.md;
these tests keep the subclassing in place, which every one of those checks relies on.
"""

from __future__ import annotations

import importlib

import pytest


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    ("ours", "lightnings", "places"),
    [
        (
            "lightning_strategies_xla.strategy.XLAStrategy",
            "lightning.pytorch.strategies.XLAStrategy",
            "Trainer connector: XLAPrecision, XLAAccelerator pairing, is_distributed",
        ),
        (
            "lightning_strategies_xla.strategy.SingleDeviceXLAStrategy",
            "lightning.pytorch.strategies.SingleDeviceXLAStrategy",
            "Trainer connector: XLAPrecision, XLAAccelerator pairing",
        ),
        (
            "lightning_strategies_xla.fabric.XLAStrategy",
            "lightning.fabric.strategies.XLAStrategy",
            "Fabric: setup_dataloaders, no_backward_sync, _move_model_to_device, setup_optimizers, connector",
        ),
        (
            "lightning_strategies_xla.fabric.SingleDeviceXLAStrategy",
            "lightning.fabric.strategies.SingleDeviceXLAStrategy",
            "Fabric connector: XLAPrecision, XLAAccelerator pairing",
        ),
        (
            "lightning_strategies_xla.fabric.XLAFSDPStrategy",
            "lightning.fabric.strategies.XLAFSDPStrategy",
            "Fabric connector: XLAPrecision, XLAAccelerator pairing",
        ),
        (
            "lightning_strategies_xla.XLAAccelerator",
            "lightning.pytorch.accelerators.XLAAccelerator",
            "evaluation loops under no_grad on XLA; the Trainer connector's strategy pairing",
        ),
        (
            "lightning_strategies_xla.precision.XLAPrecision",
            "lightning.pytorch.plugins.precision.XLAPrecision",
            "ThroughputMonitor's compute dtype (callbacks/throughput_monitor.py)",
        ),
        (
            "lightning_strategies_xla.fabric.XLAPrecision",
            "lightning.fabric.plugins.precision.XLAPrecision",
            "Fabric's ThroughputMonitor compute dtype (fabric/utilities/throughput.py)",
        ),
    ],
)
def test_lightnings_xla_checks_see_ours_as_theirs(ours: str, lightnings: str, places: str) -> None:
    assert issubclass(_class(ours), _class(lightnings)), f"{ours} must pass Lightning's checks in: {places}"


@pytest.mark.parametrize(("flag", "dtype"), [("32-true", "float32"), ("bf16-true", "bfloat16"), ("16-true", "float16")])
def test_throughput_monitor_reads_the_compute_dtype_of_our_plugins(flag: str, dtype: str) -> None:
    """ThroughputMonitor reads ``_desired_dtype`` from Lightning's XLAPrecision, whose constructor ours does not
    call (it sets XLA_USE_BF16): ours must set it, or the monitor fails with an AttributeError."""
    pytest.importorskip("torch_xla", reason="our XLA precision plugins are built only where torch_xla is installed")
    import torch
    from lightning.fabric.utilities.throughput import _plugin_to_compute_dtype as fabric_compute_dtype
    from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype

    from lightning_strategies_xla import fabric, precision

    assert _plugin_to_compute_dtype(precision.XLAPrecision(flag)) == getattr(torch, dtype)
    assert fabric_compute_dtype(fabric.XLAPrecision(flag)) == getattr(torch, dtype)
