"""LightningCLI builds the strategy from a command line and from YAML with every parameter of the Lightning 1.x
ColossalAIStrategy (the seed API page) and ours, each annotated with a real type."""

from __future__ import annotations

import inspect
import typing
from datetime import timedelta

import pytest

from lightning_strategies.testing import check_lightning_cli_builds
from lightning_strategies_colossalai.strategy import ColossalAIStrategy

pytest.importorskip("jsonargparse")

# The seed's parameters, in its order, with values other than its defaults where that is allowed on its own.
SEED = {
    "use_chunk": True,
    "chunk_size": 1024,
    "enable_distributed_storage": True,
    "placement_policy": "cpu",
    "force_outputs_fp32": True,
    "gpu_margin_mem_ratio": 0.0,
    "chunk_search_range": 2**25,
    "chunk_search_n_grids": 1024,
    "min_chunk_size": 2**24,
    "initial_scale": 1024.0,
    "min_scale": 2.0,
    "growth_factor": 3.0,
    "backoff_factor": 0.25,
    "growth_interval": 500,
    "hysteresis": 3,
    "max_scale": 2.0**20,
    "accelerator": {"class_path": "lightning.pytorch.accelerators.CUDAAccelerator"},
    "cluster_environment": {"class_path": "lightning.fabric.plugins.environments.LightningEnvironment"},
    "checkpoint_io": {"class_path": "lightning.fabric.plugins.io.TorchCheckpointIO"},
    "precision_plugin": {
        "class_path": "lightning_strategies_colossalai.precision.GeminiPrecision",
        "init_args": {"precision": "bf16-mixed"},
    },
}
OURS = {
    "state_dict_type": "sharded",
    "shard_size_mb": 256,
    "offload_optim_frac": None,  # read with placement "static" only
    "offload_param_frac": None,
    "pin_memory": False,
    "max_prefetch": 2,
    "process_group_backend": "nccl",
    "timeout": "0:10:00",
}
# No command line can give torch.device objects.
NOT_FROM_A_COMMAND_LINE = {"parallel_devices"}


def test_every_parameter_is_typed_and_read_from_a_command_line_and_yaml() -> None:
    hints = typing.get_type_hints(ColossalAIStrategy.__init__)
    assert [name for name, kind in hints.items() if kind is typing.Any] == []
    assert set(SEED) | set(OURS) | NOT_FROM_A_COMMAND_LINE == set(inspect.signature(ColossalAIStrategy).parameters)
    for strategy in check_lightning_cli_builds(ColossalAIStrategy, {**SEED, **OURS}):
        settings = strategy.settings
        assert (settings.placement_policy, settings.chunk_size, settings.hysteresis) == ("cpu", 1024, 3)
        assert settings.max_prefetch == 2
        assert (settings.initial_scale, settings.max_scale, settings.state_dict_type) == (1024.0, 2.0**20, "sharded")
        assert strategy.shard_size_mb == 256
        assert strategy._timeout == timedelta(minutes=10)
