"""ZeRO stages trained for real on 2 CPU processes over gloo, each checked against plain PyTorch.

Every rank sees the same batches, so averaging gradients over ranks must give exactly the
single-process result: a wrong reduction, accumulation or clipping shows up in the weights.
All runs train one after another in one launch of 2 processes (train_script.py --runs), each
with its own model, strategy and Trainer.
"""

from __future__ import annotations

import pytest
from conftest import assert_weights_close, reference_weights, succeeded, train_together

NVME_OPTIONS = {
    "stage": 3, "offload_optimizer": True, "offload_parameters": True, "remote_device": "nvme",
    "offload_params_device": "nvme", "offload_optimizer_device": "nvme",
    "params_buffer_size": 4096, "params_buffer_count": 6,
}  # fmt: skip
OFFLOAD_NAMES = ["deepspeed_stage_2_offload", "deepspeed_stage_3_offload"]


@pytest.fixture(scope="module")
def nvme(tmp_path_factory):
    return tmp_path_factory.mktemp("nvme")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, nvme):
    # The first run starts DeepSpeed in these processes: the strategy must choose its accelerator.
    # NVMe last: where libaio is missing it fails in set-up, and the other runs must not come after that.
    cpu_adam = {"max_steps": 3, "optimizer": "cpu_adam"}
    gradient_accumulation_config = {
        "zero_optimization": {"stage": 3},
        "gradient_accumulation_steps": 2,
        "zero_allow_untested_optimizer": True,
    }
    return train_together(
        tmp_path_factory.mktemp("training"),
        {
            "deepspeed_stage_1": {"strategy": "deepspeed_stage_1", "max_steps": 4},
            "deepspeed_stage_3": {"strategy": "deepspeed_stage_3", "max_steps": 4},
            "accumulate": {"strategy": "deepspeed_stage_2", "max_steps": 4, "accumulate": 2},
            "config_accumulation": {"options": {"config": gradient_accumulation_config}, "max_steps": 3},
            "clip": {"strategy": "deepspeed_stage_2", "max_steps": 3, "clip": 0.05},
            "bf16": {"strategy": "deepspeed_stage_2", "max_steps": 3, "precision": "bf16-mixed"},
            **{f"{name}-cpu_adam": {"strategy": name, **cpu_adam} for name in OFFLOAD_NAMES},
            **{f"{name}-cpu_adam-clip": {"strategy": name, **cpu_adam, "clip": 0.05} for name in OFFLOAD_NAMES},
            "nvme": {"options": {**NVME_OPTIONS, "nvme_path": str(nvme)}, **cpu_adam},
            # DeepSpeed swaps partitions of 1 MiB or more (here in bf16): the first layer's weight (1,280,000
            # elements, 640,000 on each process) is one, and it is larger than each buffer.
            "nvme-small-buffers": {
                "options": {**NVME_OPTIONS, "nvme_path": str(nvme), "params_buffer_size": 600_000},
                "hidden": 80_000,
                **cpu_adam,
            },
        },
    )


def test_the_strategy_chooses_deepspeeds_cpu_accelerator(runs):
    first = succeeded(runs, "deepspeed_stage_1")
    # Nothing had imported DeepSpeed or set its accelerator variable when the first run began.
    assert first["before_run"] == {"deepspeed_imported": False, "environment_accelerator": None}
    assert first["ds_accelerator"] == "cpu"


@pytest.mark.parametrize("name", ["deepspeed_stage_1", "deepspeed_stage_3"])
def test_stage_trains_like_plain_pytorch(runs, name):
    result = succeeded(runs, name)
    assert result["strategy_class"] == "lightning_strategies_deepspeed.strategy.DeepSpeedStrategy"
    assert result["ds_accelerator"] == "cpu"
    assert_weights_close(result["weights"], reference_weights(max_steps=4))


def test_accumulate_grad_batches_steps_once_per_window(runs):
    """Lightning-AI/pytorch-lightning#19350: hooks, global_step and the update follow accumulation."""
    result = succeeded(runs, "accumulate")
    assert result["global_step"] == 4
    assert result["optimizer_steps"] == 4
    assert result["backward_calls"] == 8
    assert result["config"]["gradient_accumulation_steps"] == 2
    assert_weights_close(result["weights"], reference_weights(max_steps=4, accumulate=2))


def test_gradient_accumulation_steps_from_config(runs):
    """Lightning-AI/pytorch-lightning#19891: the config's value is used instead of refused."""
    result = succeeded(runs, "config_accumulation")
    assert result["global_step"] == 3
    assert result["backward_calls"] == 6
    assert_weights_close(result["weights"], reference_weights(max_steps=3, accumulate=2))


def test_gradient_clipping_by_norm(runs):
    result = succeeded(runs, "clip")
    assert result["config"]["gradient_clipping"] == 0.05
    assert_weights_close(result["weights"], reference_weights(max_steps=3, clip=0.05))


def test_bf16_mixed_trains_on_cpu(runs):
    """bf16 runs on CPU; DeepSpeed keeps fp32 masters, so the weights stay near the fp32 run."""
    result = succeeded(runs, "bf16")
    assert result["config"]["bf16"] == {"enabled": True}
    assert_weights_close(result["weights"], reference_weights(max_steps=3), tolerance=3e-2)


@pytest.mark.parametrize("name", OFFLOAD_NAMES)
def test_cpu_offload_with_deepspeed_cpu_adam(runs, name):
    result = succeeded(runs, f"{name}-cpu_adam")
    zero = result["config"]["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert ("offload_param" in zero) == (name == "deepspeed_stage_3_offload")
    assert_weights_close(result["weights"], reference_weights(max_steps=3, optimizer="adam"), tolerance=1e-4)


@pytest.mark.parametrize("name", OFFLOAD_NAMES)
def test_clipping_by_norm_with_cpu_offload_matches_plain_pytorch(runs, name):
    """Offloaded gradients are clipped to the same global norm as gradients kept beside the model
    (clipping moves these Adam weights by about 1e-2 over 3 steps, far beyond the tolerance)."""
    result = succeeded(runs, f"{name}-cpu_adam-clip")
    assert result["config"]["gradient_clipping"] == 0.05
    expected = reference_weights(max_steps=3, optimizer="adam", clip=0.05)
    assert_weights_close(result["weights"], expected, tolerance=1e-4)


def test_nvme_offload(runs, nvme):
    """Optimizer and parameters swapped to files through libaio (apt-get install -y libaio-dev)."""
    result = succeeded(runs, "nvme")
    assert result["config"]["zero_optimization"]["offload_param"]["device"] == "nvme"
    swap_folders = {folder.name for folder in (nvme / "zero_stage_3").iterdir()}
    assert "optimizer" in swap_folders and any(name.endswith("params") for name in swap_folders), swap_folders
    assert_weights_close(result["weights"], reference_weights(max_steps=3, optimizer="adam"), tolerance=1e-4)


def test_a_parameter_larger_than_the_nvme_buffers_is_said_with_the_setting_that_fixes_it(runs):
    error = runs["nvme-small-buffers"]["error"]
    expected = "A parameter's partition of 640,000 elements does not fit DeepSpeed's NVMe parameter buffers of 600,000"
    assert expected in error
    assert "params_buffer_size=640000" in error
