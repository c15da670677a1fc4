"""Every strategy name trains for real on 2 CPU processes over gloo, with checkpoint save and resume."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import read, run_group

NAMES = ("fsdp", "fsdp_cpu_offload", "fsdp_shard_grad_op", "fsdp_hybrid_shard", "fsdp_no_shard")
EXPECTED_MESH = {
    "fsdp": ([2], "(Shard(dim=0),)"),
    "fsdp_cpu_offload": ([2], "(Shard(dim=0),)"),
    "fsdp_shard_grad_op": ([2], "(Shard(dim=0),)"),
    # One node of 2 processes: 1 replica x 2 shards.
    "fsdp_hybrid_shard": ([1, 2], "(Replicate(), Shard(dim=0))"),
    # device_mesh=(2, 1): 2 replicas of 1 shard, the other layout 2 processes allow.
    "fsdp_hybrid_shard_2x1": ([2, 1], "(Replicate(), Shard(dim=0))"),
    # NO_SHARD is a replicate-only mesh: every process keeps the whole model.
    "fsdp_no_shard": ([2, 1], "(Replicate(), Shard(dim=0))"),
}


@pytest.mark.parametrize("label", [*NAMES, "fsdp_hybrid_shard_2x1"])
def test_name_trains_saves_and_resumes(names_run: Path, label: str) -> None:
    result = read(names_run, label)
    assert result["strategy_class"] == "lightning_strategies_fsdp.strategy.FSDP2Strategy"
    assert result["global_step"] == 2
    assert math.isfinite(result["train_loss"])
    assert result["param_types"] == ["DTensor"]
    mesh, placement = EXPECTED_MESH[label]
    assert result["mesh_shape"] == mesh
    assert result["placements"] == [placement]
    # 3 blocks found by the default policy, plus the root.
    assert result["sharded_modules"] == 4
    # Saved as a DCP folder; a new Trainer resumed exactly the saved weights and optimizer state.
    assert result["checkpoint_is_folder"]
    assert result["resumed_weights_equal_saved"]
    assert result["resumed_optimizer_steps"] == [2.0]
    assert result["resumed_global_step"] == 4
    assert math.isfinite(result["resumed_train_loss"])


def test_cpu_offload_keeps_parameters_in_host_memory(names_run: Path) -> None:
    assert read(names_run, "fsdp_cpu_offload")["param_devices"] == ["cpu"]


@pytest.fixture(scope="module")
def precision_run(scenario_root: Path) -> Path:
    return run_group("precision", scenario_root / "precision")


@pytest.mark.parametrize(
    ("precision", "stored", "compute"),
    [
        ("32-true", "torch.float32", "torch.float32"),
        # Mixed: fp32 shards (the optimizer's master weights), low-precision all-gathered copies.
        ("bf16-mixed", "torch.float32", "torch.bfloat16"),
        # Lightning itself turns 16-mixed into bf16-mixed on CPU (fp16 AMP is CUDA-only there);
        # the GPU tier checks fp16 with its gradient scaler.
        ("16-mixed", "torch.float32", "torch.bfloat16"),
        ("bf16-true", "torch.bfloat16", "torch.bfloat16"),
        ("policy", "torch.float32", "torch.bfloat16"),
    ],
)
def test_precision(precision_run: Path, precision: str, stored: str, compute: str) -> None:
    result = read(precision_run, f"precision_{precision}")
    assert result["global_step"] == 2
    assert math.isfinite(result["train_loss"])
    assert result["param_dtypes"] == [stored]
    assert result["compute_dtypes"] == [compute]


@pytest.fixture(scope="module")
def features_run(scenario_root: Path) -> Path:
    return run_group("features", scenario_root / "features")


def _trained(result: dict) -> None:
    assert result["global_step"] == 2
    assert math.isfinite(result["train_loss"])
    assert result["all_finite"]


@pytest.mark.parametrize(
    ("label", "sharded_modules"),
    [
        ("wrap_set", 4),  # {Block}: 3 blocks + root
        ("wrap_module_policy", 8),  # ModuleWrapPolicy({nn.Linear}): 7 linears + root
        ("wrap_size_based", 7),  # size_based_auto_wrap_policy(min_num_params=500): 6 block linears + root
        ("wrap_callable", 1),  # a callable that selects nothing: the root only
    ],
)
def test_auto_wrap_policy_selects_modules(features_run: Path, label: str, sharded_modules: int) -> None:
    result = read(features_run, label)
    _trained(result)
    assert result["sharded_modules"] == sharded_modules


def test_meta_device_init_through_configure_model(features_run: Path) -> None:
    result = read(features_run, "meta_init")
    _trained(result)
    assert result["param_types"] == ["DTensor"]


def test_param_init_fn_initializes_meta_parameters(features_run: Path) -> None:
    result = read(features_run, "param_init_fn")
    _trained(result)
    assert result["differs_from_default_init"]


def test_sync_module_states_starts_every_process_from_rank_zero(features_run: Path) -> None:
    assert read(features_run, "sync_module_states")["start_equals_rank0"]


def test_activation_checkpointing(features_run: Path) -> None:
    result = read(features_run, "activation_checkpointing")
    _trained(result)
    assert result["checkpointed_blocks"] == 3


def test_torch_compile_of_sharded_blocks(features_run: Path) -> None:
    result = read(features_run, "compile")
    _trained(result)
    assert result["compiled_blocks"] == 3


def test_prefetch_and_gradient_accumulation(features_run: Path) -> None:
    _trained(read(features_run, "forward_prefetch"))
    _trained(read(features_run, "accumulate"))


def test_fsdp1_only_knobs_warn_what_fsdp2_does_instead(features_run: Path) -> None:
    result = read(features_run, "obsolete_fsdp1_knobs")
    _trained(result)
    assert any("limit_all_gathers" in warning and "FSDP2" in warning for warning in result["warnings"])
    assert any("use_orig_params" in warning and "DTensor" in warning for warning in result["warnings"])


def test_fabric_trains_saves_and_loads(fabric_run: Path) -> None:
    result = read(fabric_run, "fabric")
    assert result["strategy_class"] == "FSDP2FabricStrategy"
    assert result["losses"][-1] < result["losses"][0]
    assert result["checkpoint_is_folder"]
    assert result["loaded_weights_equal"]
    assert result["optimizer_state_loaded"]
    # A later save failed half way (DCP's index write): the checkpoint of step 3 is what loaded.
    assert result["failed_save_error"] == "CheckpointException"
    assert result["loaded_step"] == 3
