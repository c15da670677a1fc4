"""Lightning's words first (issue 32): ours subclass Lightning's XLA classes, so most refusals are Lightning's own;
where ours refuse in their own code, they raise Lightning's type (or a subclass) with a message that begins with
Lightning's, read here from the installed Lightning.

These run without torch_xla: Lightning's XLA classes refuse to be built without it, so each refusal is asked of an
instance of Lightning's class and of ours that was not built (``object.__new__``), holding only what the refusing
method reads, and torch_xla's two calls on the way are stood in for.
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest.mock import Mock

import pytest
from lightning.fabric.accelerators.xla import XLAAccelerator as LightningFabricXLAAccelerator
from lightning.fabric.plugins.precision import Precision as FabricPrecision
from lightning.fabric.strategies import SingleDeviceXLAStrategy as LightningFabricSingleDeviceXLAStrategy
from lightning.fabric.strategies import XLAFSDPStrategy as LightningFabricXLAFSDPStrategy
from lightning.fabric.strategies import XLAStrategy as LightningFabricXLAStrategy
from lightning.pytorch.accelerators import XLAAccelerator as LightningXLAAccelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.plugins.precision import XLAPrecision as LightningXLAPrecision
from lightning.pytorch.strategies import SingleDeviceXLAStrategy as LightningSingleDeviceXLAStrategy
from lightning.pytorch.strategies import XLAStrategy as LightningXLAStrategy

from lightning_strategies.testing import assert_raises_as_lightning, lightnings_strategy_name_check
from lightning_strategies_xla import fabric, strategy
from lightning_strategies_xla.accelerator import XLAAccelerator
from lightning_strategies_xla.precision import XLAPrecision


def _unbuilt(cls: type, **attributes: Any) -> Any:
    instance = object.__new__(cls)
    instance.__dict__.update(attributes)
    return instance


LAUNCHED = [
    (LightningXLAStrategy, strategy.XLAStrategy),
    (LightningFabricXLAStrategy, fabric.XLAStrategy),
    (LightningFabricXLAFSDPStrategy, fabric.XLAFSDPStrategy),
]


@pytest.mark.parametrize(("lightnings", "ours"), LAUNCHED, ids=["trainer", "fabric", "fabric-fsdp"])
def test_the_device_before_the_processes_are_launched(lightnings: type, ours: type) -> None:
    assert_raises_as_lightning(
        lambda: _unbuilt(lightnings, _launched=False).root_device, lambda: _unbuilt(ours, _launched=False).root_device
    )


class _UsersPrecision(Precision):
    """A precision plugin of the user's own, not XLA's (Lightning's stock plugins become ours)."""


class _UsersFabricPrecision(FabricPrecision):
    pass


@pytest.mark.parametrize(
    ("lightnings", "ours"),
    [
        (LightningXLAStrategy, strategy.XLAStrategy),
        (LightningSingleDeviceXLAStrategy, strategy.SingleDeviceXLAStrategy),
    ],
    ids=["xla", "single"],
)
def test_a_precision_plugin_not_of_xla_in_the_trainer(lightnings: type, ours: type) -> None:
    plugin = _UsersPrecision()

    def assign(instance: Any) -> None:
        instance.precision_plugin = plugin

    assert_raises_as_lightning(
        lambda: assign(_unbuilt(lightnings, _precision_plugin=None)),
        lambda: assign(_unbuilt(ours, _precision_plugin=None, _own_precision_given=False)),
    )


@pytest.mark.parametrize(
    ("lightnings", "ours"),
    [
        (LightningFabricXLAStrategy, fabric.XLAStrategy),
        (LightningFabricSingleDeviceXLAStrategy, fabric.SingleDeviceXLAStrategy),
        (LightningFabricXLAFSDPStrategy, fabric.XLAFSDPStrategy),
    ],
    ids=["xla", "single", "fsdp"],
)
def test_a_precision_plugin_not_of_xla_in_fabric(lightnings: type, ours: type) -> None:
    plugin = _UsersFabricPrecision()

    def assign(instance: Any) -> None:
        instance.precision = plugin

    assert_raises_as_lightning(
        lambda: assign(_unbuilt(lightnings, _precision=None)), lambda: assign(_unbuilt(ours, _precision=None))
    )


def test_a_training_step_that_returns_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's second sentence asks for an issue in Lightning's tracker, which ours does not."""
    torch_xla = ModuleType("torch_xla")
    torch_xla.sync = lambda: None  # type: ignore[attr-defined]
    xla_model = ModuleType("torch_xla.core.xla_model")
    xla_model.mark_step = lambda: None  # type: ignore[attr-defined]
    for name, module in [("torch_xla", torch_xla), ("torch_xla.core", ModuleType("torch_xla.core"))]:
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "torch_xla.core.xla_model", xla_model)
    optimizer = Mock(step=Mock(return_value=None))  # the step's closure returned None
    model = SimpleNamespace(automatic_optimization=True)
    assert_raises_as_lightning(
        lambda: _unbuilt(LightningXLAPrecision).optimizer_step(optimizer, model, lambda: None),
        lambda: _unbuilt(XLAPrecision).optimizer_step(optimizer, model, lambda: None),
        sentences=1,
    )


def test_xla_fsdp_in_the_trainer() -> None:
    """Lightning's Trainer has no ``xla_fsdp``: its connector calls the name invalid; ours says Fabric has it."""
    assert_raises_as_lightning(
        lambda: lightnings_strategy_name_check("xla_fsdp", "Trainer"), strategy.XLAFSDPStrategy, sentences=1
    )


@pytest.mark.parametrize("devices", [True, None, 1.5, ["0"], "a,b", 3, "3", [4], (5,)])
def test_devices_xla_cannot_use(monkeypatch: pytest.MonkeyPatch, devices: Any) -> None:
    monkeypatch.setattr(LightningFabricXLAAccelerator, "auto_device_count", staticmethod(lambda: 4))
    monkeypatch.setattr(XLAAccelerator, "auto_device_count", staticmethod(lambda: 4))
    assert_raises_as_lightning(
        lambda: LightningXLAAccelerator.parse_devices(devices), lambda: XLAAccelerator.parse_devices(devices)
    )
