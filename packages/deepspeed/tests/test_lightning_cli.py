"""LightningCLI builds both strategies from a command line and from YAML with every argument Lightning's
DeepSpeedStrategy takes there, each read into what Lightning's class would get."""

from __future__ import annotations

import inspect
import json
from datetime import timedelta
from pathlib import Path

import pytest
from lightning.fabric.strategies import DeepSpeedStrategy as LightningFabricDeepSpeedStrategy
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeedStrategy

from lightning_strategies.testing import check_lightning_cli_builds
from lightning_strategies_deepspeed.fabric import DeepSpeedFabricStrategy
from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy

pytest.importorskip("jsonargparse")

FACES = {
    DeepSpeedStrategy: (
        LightningDeepSpeedStrategy,
        {
            "accelerator": {"class_path": "lightning.pytorch.accelerators.CPUAccelerator"},
            "precision_plugin": {
                "class_path": "lightning.pytorch.plugins.precision.DeepSpeedPrecision",
                "init_args": {"precision": "bf16-mixed"},
            },
        },
    ),
    DeepSpeedFabricStrategy: (
        LightningFabricDeepSpeedStrategy,
        {
            "accelerator": {"class_path": "lightning.fabric.accelerators.CPUAccelerator"},
            "precision": {
                "class_path": "lightning.fabric.plugins.precision.DeepSpeedPrecision",
                "init_args": {"precision": "bf16-mixed"},
            },
        },
    ),
}
# Not the defaults, so that each is seen to arrive; they hold together (no config given, so none is ignored).
CHOSEN = {
    "stage": 3,
    "offload_optimizer": True,
    "offload_parameters": True,
    "remote_device": "cpu",
    "partition_activations": True,
    "contiguous_memory_optimization": True,
    "logging_batch_size_per_gpu": 4,
    "cluster_environment": {"class_path": "lightning.fabric.plugins.environments.LightningEnvironment"},
    "process_group_backend": "gloo",
    "timeout": "0:10:00",
    "exclude_frozen_parameters": True,
}
# Lightning's parameters no command line can give (jsonargparse cannot make a torch.device for Lightning's class
# either), and the config, which makes the other parameters ineffective (given on its own below).
NOT_IN_ONE_COMMAND_LINE = {"parallel_devices", "config"}


def every_argument(lightning_class: type, own: dict) -> dict:
    """Every argument Lightning's class takes from a command line: its default where that is a plain value."""
    parameters = inspect.signature(lightning_class).parameters.items()
    defaults = {name: p.default for name, p in parameters if isinstance(p.default, (bool, int, float, str))}
    return {**defaults, **CHOSEN, **own}


@pytest.mark.parametrize("strategy_class", FACES)
def test_every_argument_lightning_takes_is_read_from_a_command_line_and_yaml(strategy_class: type) -> None:
    lightning_class, own = FACES[strategy_class]
    values = every_argument(lightning_class, own)
    assert set(values) | NOT_IN_ONE_COMMAND_LINE == set(inspect.signature(lightning_class).parameters)
    for strategy in check_lightning_cli_builds(strategy_class, values, lightning_class):
        zero = strategy.config["zero_optimization"]
        assert zero["stage"] == 3
        assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
        assert strategy.config["activation_checkpointing"]["partition_activations"] is True
        assert strategy.config["train_micro_batch_size_per_gpu"] == 4
        assert strategy.remote_device == "cpu"
        assert strategy.exclude_frozen_parameters is True
        assert strategy._timeout == timedelta(minutes=10)


@pytest.mark.parametrize("strategy_class", FACES)
@pytest.mark.parametrize("given", ["dict", "file"])
def test_a_config_is_read_as_a_dict_or_a_file(strategy_class: type, given: str, tmp_path: Path) -> None:
    config = {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 2}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    value = config if given == "dict" else str(path)
    lightning_class, _ = FACES[strategy_class]
    for strategy in check_lightning_cli_builds(strategy_class, {"config": value}, lightning_class):
        assert strategy.config == config


@pytest.mark.parametrize("strategy_class", FACES)
def test_the_plans_partial_offload_is_read_from_a_command_line_and_yaml(strategy_class: type) -> None:
    """`plan` answers e.g. deepspeed_stage_3 with offload_optimizer=0.85: a share, which a YAML config and
    --trainer.strategy.offload_optimizer=0.85 must carry as written (Lightning's own class takes a bool only)."""
    _, own = FACES[strategy_class]
    values = {**own, "stage": 3, "offload_optimizer": 0.85, "sub_group_size": 10_000_000}
    for strategy in check_lightning_cli_builds(strategy_class, values):
        assert strategy.config["zero_optimization"]["offload_optimizer"]["ratio"] == 0.85
    for whole in (True, False):
        for strategy in check_lightning_cli_builds(strategy_class, {**values, "offload_optimizer": whole}):
            offloaded = strategy.config["zero_optimization"].get("offload_optimizer")
            assert (offloaded is not None and "ratio" not in offloaded) if whole else offloaded is None


@pytest.mark.parametrize("share", [0, 1.5, -0.2])
def test_a_share_outside_zero_to_one_is_refused_with_the_values_allowed(share: float) -> None:
    _, own = FACES[DeepSpeedStrategy]
    values = {**own, "stage": 3, "offload_optimizer": share}
    with pytest.raises(Exception, match=r"a number above 0 and at most 1"):
        check_lightning_cli_builds(DeepSpeedStrategy, values)
