"""ZeRO stages trained for real on 2 CPU processes over gloo, each checked against plain PyTorch.

Every rank sees the same batches, so averaging gradients over ranks must give exactly the
single-process result: a wrong reduction, accumulation or clipping shows up in the weights.
"""

from __future__ import annotations

import pytest
from conftest import assert_weights_close, reference_weights


@pytest.mark.parametrize("name", ["deepspeed_stage_1", "deepspeed_stage_3"])
def test_stage_trains_like_plain_pytorch(train, name):
    result = train(name, max_steps=4)
    assert result["strategy_class"] == "lightning_strategies_deepspeed.strategy.DeepSpeedStrategy"
    assert result["ds_accelerator"] == "cpu"  # chosen by the strategy: the environment had no DS_ACCELERATOR
    assert_weights_close(result["weights"], reference_weights(max_steps=4))


def test_accumulate_grad_batches_steps_once_per_window(train):
    """Lightning-AI/pytorch-lightning#19350: hooks, global_step and the update follow accumulation."""
    result = train("deepspeed_stage_2", max_steps=4, accumulate=2)
    assert result["global_step"] == 4
    assert result["optimizer_steps"] == 4
    assert result["backward_calls"] == 8
    assert result["config"]["gradient_accumulation_steps"] == 2
    assert_weights_close(result["weights"], reference_weights(max_steps=4, accumulate=2))


def test_gradient_accumulation_steps_from_config(train):
    """Lightning-AI/pytorch-lightning#19891: the config's value is used instead of refused."""
    config = {
        "zero_optimization": {"stage": 3},
        "gradient_accumulation_steps": 2,
        "zero_allow_untested_optimizer": True,
    }
    result = train(options={"config": config}, max_steps=3)
    assert result["global_step"] == 3
    assert result["backward_calls"] == 6
    assert_weights_close(result["weights"], reference_weights(max_steps=3, accumulate=2))


def test_gradient_clipping_by_norm(train):
    result = train("deepspeed_stage_2", max_steps=3, clip=0.05)
    assert result["config"]["gradient_clipping"] == 0.05
    assert_weights_close(result["weights"], reference_weights(max_steps=3, clip=0.05))


def test_bf16_mixed_trains_on_cpu(train):
    """bf16 runs on CPU; DeepSpeed keeps fp32 masters, so the weights stay near the fp32 run."""
    result = train("deepspeed_stage_2", max_steps=3, precision="bf16-mixed")
    assert result["config"]["bf16"] == {"enabled": True}
    assert_weights_close(result["weights"], reference_weights(max_steps=3), tolerance=3e-2)


@pytest.mark.parametrize("name", ["deepspeed_stage_2_offload", "deepspeed_stage_3_offload"])
def test_cpu_offload_with_deepspeed_cpu_adam(train, name):
    result = train(name, max_steps=3, optimizer="cpu_adam")
    zero = result["config"]["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert ("offload_param" in zero) == (name == "deepspeed_stage_3_offload")
    assert_weights_close(result["weights"], reference_weights(max_steps=3, optimizer="adam"), tolerance=1e-4)


@pytest.mark.parametrize("name", ["deepspeed_stage_2_offload", "deepspeed_stage_3_offload"])
def test_clipping_by_norm_with_cpu_offload_matches_plain_pytorch(train, name):
    """Offloaded gradients are clipped to the same global norm as gradients kept beside the model
    (clipping moves these Adam weights by about 1e-2 over 3 steps, far beyond the tolerance)."""
    result = train(name, max_steps=3, optimizer="cpu_adam", clip=0.05)
    assert result["config"]["gradient_clipping"] == 0.05
    expected = reference_weights(max_steps=3, optimizer="adam", clip=0.05)
    assert_weights_close(result["weights"], expected, tolerance=1e-4)


def test_nvme_offload(train, tmp_path):
    """Optimizer and parameters swapped to files through libaio (apt-get install -y libaio-dev)."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    options = {
        "stage": 3, "offload_optimizer": True, "offload_parameters": True, "remote_device": "nvme",
        "offload_params_device": "nvme", "offload_optimizer_device": "nvme", "nvme_path": str(nvme),
        "params_buffer_size": 4096, "params_buffer_count": 6,
    }  # fmt: skip
    result = train(options=options, max_steps=3, optimizer="cpu_adam")
    assert result["config"]["zero_optimization"]["offload_param"]["device"] == "nvme"
    swap_folders = {folder.name for folder in (nvme / "zero_stage_3").iterdir()}
    assert "optimizer" in swap_folders and any(name.endswith("params") for name in swap_folders), swap_folders
    assert_weights_close(result["weights"], reference_weights(max_steps=3, optimizer="adam"), tolerance=1e-4)
