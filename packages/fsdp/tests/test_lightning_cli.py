"""LightningCLI builds both strategies from a command line and from YAML with every argument Lightning's
FSDPStrategy takes there, each read into the object Lightning's class would get."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest
import torch
from lightning.fabric.strategies import FSDPStrategy as LightningFabricFSDPStrategy
from lightning.pytorch.strategies import FSDPStrategy as LightningFSDPStrategy
from torch.distributed.fsdp import CPUOffloadPolicy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from lightning_strategies.testing import check_lightning_cli_builds
from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy
from lightning_strategies_fsdp.strategy import FSDP2Strategy

pytest.importorskip("jsonargparse")

LINEAR = "torch.nn.Linear"
SHARED = {
    "cluster_environment": {"class_path": "lightning.fabric.plugins.environments.LightningEnvironment"},
    "process_group_backend": "gloo",
    "timeout": "0:10:00",
    "cpu_offload": {"class_path": "torch.distributed.fsdp.CPUOffload", "init_args": {"offload_params": True}},
    "mixed_precision": {
        "class_path": "torch.distributed.fsdp.MixedPrecision",
        "init_args": {"param_dtype": "torch.bfloat16"},
    },
    "auto_wrap_policy": [LINEAR],
    "activation_checkpointing_policy": {
        "class_path": "torch.distributed.fsdp.wrap.ModuleWrapPolicy",
        "init_args": {"module_classes": [LINEAR]},
    },
    "sharding_strategy": "SHARD_GRAD_OP",
    "state_dict_type": "full",
    "device_mesh": [1, 1],
}
FACES = {
    FSDP2Strategy: (
        LightningFSDPStrategy,
        {
            "accelerator": {"class_path": "lightning.pytorch.accelerators.CPUAccelerator"},
            "checkpoint_io": {"class_path": "lightning.fabric.plugins.io.TorchCheckpointIO"},
            "precision_plugin": {"class_path": "lightning.pytorch.plugins.precision.Precision"},
        },
    ),
    FSDP2FabricStrategy: (
        LightningFabricFSDPStrategy,
        {
            "accelerator": {"class_path": "lightning.fabric.accelerators.CPUAccelerator"},
            "precision": {"class_path": "lightning.fabric.plugins.precision.Precision"},
        },
    ),
}
# Lightning's parameters no command line can give (jsonargparse cannot make a torch.device for Lightning's class
# either), and the deprecated one that cannot be given with activation_checkpointing_policy (tested on its own).
NOT_IN_ONE_COMMAND_LINE = {"parallel_devices", "activation_checkpointing"}


@pytest.mark.parametrize("strategy_class", FACES)
def test_every_argument_lightning_takes_is_read_from_a_command_line_and_yaml(strategy_class: type) -> None:
    lightning_class, own = FACES[strategy_class]
    values = {**SHARED, **own}
    lightnings = {name for name, parameter in inspect.signature(lightning_class).parameters.items()}
    assert set(values) | NOT_IN_ONE_COMMAND_LINE == lightnings - {"kwargs"}
    for strategy in check_lightning_cli_builds(strategy_class, values, lightning_class):
        options = strategy.options
        assert options.sharding_strategy == "SHARD_GRAD_OP"
        assert isinstance(options.offload_policy, CPUOffloadPolicy)
        assert options.mp_policy.param_dtype == torch.bfloat16
        assert options.auto_wrap_policy == {torch.nn.Linear}
        assert isinstance(options.activation_checkpointing_policy, ModuleWrapPolicy)
        assert options.device_mesh == (1, 1)
        assert strategy.state_dict_type == "full"
        assert strategy._timeout == timedelta(minutes=10)


@pytest.mark.parametrize("strategy_class", FACES)
def test_the_deprecated_activation_checkpointing_is_read_and_becomes_the_policy(strategy_class: type) -> None:
    lightning_class, _ = FACES[strategy_class]
    with pytest.deprecated_call(match=r"use `FSDPStrategy\(activation_checkpointing_policy="):
        built = check_lightning_cli_builds(strategy_class, {"activation_checkpointing": [LINEAR]}, lightning_class)
    assert [strategy.options.activation_checkpointing_policy for strategy in built] == [{torch.nn.Linear}] * 2
