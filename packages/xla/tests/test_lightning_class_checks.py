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
    ],
)
def test_lightnings_xla_checks_see_ours_as_theirs(ours: str, lightnings: str, places: str) -> None:
    assert issubclass(_class(ours), _class(lightnings)), f"{ours} must pass Lightning's checks in: {places}"
