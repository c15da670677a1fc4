"""LightningCLI reads every XLA strategy's arguments into the types Lightning's classes take: the annotations are
real types wherever Lightning's are (checked without torch_xla), and each strategy is built from a command line and
from YAML (with torch_xla)."""

from __future__ import annotations

import inspect
import typing

import lightning.fabric.strategies as lightning_fabric
import lightning.pytorch.strategies as lightning_trainer
import pytest

from lightning_strategies.testing import check_lightning_cli_builds
from lightning_strategies_xla import fabric, strategy

CHECKPOINT_IO = {"class_path": "lightning.fabric.plugins.io.XLACheckpointIO"}
# (ours, Lightning's, what a command line gives it)
FACES = [
    (strategy.XLAStrategy, lightning_trainer.XLAStrategy, {"debug": True, "sync_module_states": False}),
    (strategy.SingleDeviceXLAStrategy, lightning_trainer.SingleDeviceXLAStrategy, {"device": 0, "debug": True}),
    (fabric.XLAStrategy, lightning_fabric.XLAStrategy, {"debug": True, "sync_module_states": False}),
    (fabric.SingleDeviceXLAStrategy, lightning_fabric.SingleDeviceXLAStrategy, {"device": 0, "debug": True}),
]
IDS = [f"{ours.__module__.rpartition('.')[2]}.{ours.__name__}" for ours, _, _ in FACES]


@pytest.mark.parametrize(("ours", "lightnings", "values"), FACES, ids=IDS)
def test_no_parameter_is_any_where_lightnings_has_a_type(ours: type, lightnings: type, values: dict) -> None:
    hints = typing.get_type_hints(ours.__init__)
    typed = [
        name
        for name, parameter in inspect.signature(lightnings).parameters.items()
        if parameter.annotation not in (typing.Any, parameter.empty)
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]
    assert [name for name in typed if hints.get(name, typing.Any) is typing.Any] == []


@pytest.mark.parametrize(("ours", "lightnings", "values"), FACES, ids=IDS)
def test_built_from_a_command_line_and_yaml(ours: type, lightnings: type, values: dict) -> None:
    pytest.importorskip("torch_xla")
    pytest.importorskip("jsonargparse")
    for built in check_lightning_cli_builds(ours, {**values, "checkpoint_io": CHECKPOINT_IO}, lightnings):
        assert built.debug is True
