"""What Lightning's own FSDP tests check on CPU, checked on ours (issue 16, item 3).

Each test names the Lightning test it answers (tests/tests_pytorch/strategies/test_fsdp.py, "pytorch::", and
tests/tests_fabric/strategies/test_fsdp.py, "fabric::"). docs/lightning-compatibility.md maps every one of
Lightning's tests to ours, or to the difference we intend (FSDP1-only rules). Lightning checks checkpoint paths
against mocked FSDP1 modules; ours are checked on a real FSDP2 model, built once on one CPU process (gloo) by
running this file as a script (``python test_lightning_behaviours.py OUT``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from lightning.pytorch.plugins.precision import HalfPrecision
from torch import nn
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy

from lightning_strategies.testing import described, error_of, raised_by
from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy
from lightning_strategies_fsdp.strategy import FSDP2Strategy

BOTH = pytest.mark.parametrize("strategy_class", [FSDP2Strategy, FSDP2FabricStrategy])


# -- constructor and attributes ------------------------------------------------------------------------------


@BOTH
def test_mixed_precision_config_is_kept_and_read_as_a_policy(strategy_class: type) -> None:
    """pytorch:: and fabric::test_custom_mixed_precision"""
    config = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    strategy = strategy_class(mixed_precision=config)
    assert strategy.mixed_precision is config
    # FSDP2 runs on a MixedPrecisionPolicy: the attribute Lightning exposes carries the same dtypes.
    assert strategy.mixed_precision_config.param_dtype == torch.bfloat16
    assert strategy.mixed_precision_config.reduce_dtype == torch.float32


@BOTH
def test_mixed_precision_dtypes_given_by_name(strategy_class: type) -> None:
    """A YAML config or a JSON option cannot write torch.bfloat16: the policy's dtypes are also read by name."""
    strategy = strategy_class(mixed_precision={"param_dtype": "bfloat16", "reduce_dtype": "torch.float32"})
    assert strategy.mixed_precision_config.param_dtype == torch.bfloat16
    assert strategy.mixed_precision_config.reduce_dtype == torch.float32
    message = error_of(lambda: strategy_class(mixed_precision={"reduce_dtype": "bf16"}))
    assert "'bf16' is not a torch dtype" in message and "'bfloat16'" in message


@BOTH
def test_cpu_offload_from_a_flag_or_a_config(strategy_class: type) -> None:
    """pytorch::test_strategy_cpu_offload, fabric::test_cpu_offload"""
    assert strategy_class(cpu_offload=True).cpu_offload == CPUOffload(offload_params=True)
    config = CPUOffload()
    assert strategy_class(cpu_offload=config).cpu_offload == config
    assert strategy_class().cpu_offload == CPUOffload(offload_params=False)


@BOTH
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, ShardingStrategy.FULL_SHARD),
        (ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.SHARD_GRAD_OP),
        ("NO_SHARD", ShardingStrategy.NO_SHARD),
        ("no_shard", ShardingStrategy.NO_SHARD),
    ],
)
def test_sharding_strategy_from_an_enum_or_a_name(strategy_class: type, given: Any, expected: Any) -> None:
    """pytorch:: and fabric::test_sharding_strategy"""
    strategy = strategy_class() if given is None else strategy_class(sharding_strategy=given)
    assert strategy.sharding_strategy == expected


@BOTH
@pytest.mark.parametrize("name", ["HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"])
def test_hybrid_sharding_needs_no_wrap_policy_or_process_group(strategy_class: type, name: str) -> None:
    """pytorch:: and fabric::test_hybrid_shard_configuration: FSDP1 refuses hybrid sharding without a wrap policy or
    process groups; FSDP2 builds its hybrid mesh from the node count, or from ``device_mesh`` (intended)."""
    assert strategy_class(sharding_strategy=name).sharding_strategy.name == name
    assert strategy_class(sharding_strategy=name, auto_wrap_policy={nn.Linear}).sharding_strategy.name == name
    meshed = strategy_class(sharding_strategy=name, device_mesh=(2, 4))
    assert meshed.sharding_strategy.name == name
    assert meshed.options.device_mesh == (2, 4)
    with pytest.warns(UserWarning, match=r"process_group=.*has no effect"):
        strategy_class(sharding_strategy=name, process_group=(object(), object()))


@BOTH
def test_a_device_mesh_given_as_a_list_is_accepted(strategy_class: type) -> None:
    """pytorch:: and fabric::test_device_mesh_type_annotation: what a command line (LightningCLI) passes"""
    assert strategy_class(device_mesh=[1, 4]).options.device_mesh == (1, 4)


@BOTH
def test_use_orig_params_false_warns_that_fsdp2_always_keeps_them(strategy_class: type) -> None:
    """pytorch::test_use_orig_params, fabric::test_setup_use_orig_params (intended: FSDP1-only setting)"""
    with pytest.warns(UserWarning, match=r"use_orig_params=False\) has no effect"):
        strategy_class(use_orig_params=False)


def test_half_precision_is_accepted() -> None:
    """pytorch:: and fabric::test_forbidden_precision_raises: FSDP1 needs its FSDPPrecision; FSDP2 casts with the
    generic plugins (intended)."""
    plugin = FSDP2Strategy(precision_plugin=HalfPrecision("bf16-true")).precision_plugin
    assert isinstance(plugin, HalfPrecision)
    assert plugin.precision == "bf16-true"


@BOTH
def test_an_unknown_state_dict_type_is_refused_at_construction(strategy_class: type) -> None:
    """pytorch:: and fabric::test_save_checkpoint_unknown_state_dict_type (Lightning refuses at save time)"""
    with pytest.raises(ValueError, match=r"state_dict_type='invalid'.*Choose one of: 'sharded', 'full'"):
        strategy_class(state_dict_type="invalid")


def test_fabric_has_backward_sync_control() -> None:
    """fabric::test_no_backward_sync (that the control exists; skipping the reduction: test_training.py)"""
    assert isinstance(FSDP2FabricStrategy()._backward_sync_control, _BackwardSyncControl)


# -- errors for bad input ------------------------------------------------------------------------------------


def test_sharded_save_refuses_storage_options(tmp_path: Path) -> None:
    """pytorch:: and fabric::test_save_checkpoint_storage_options"""
    message = r"writes checkpoints with torch.distributed.checkpoint, which takes no storage_options"
    with pytest.raises(TypeError, match=message):
        FSDP2Strategy().save_checkpoint({}, tmp_path / "ckpt", storage_options={})
    with pytest.raises(TypeError, match=message):
        FSDP2FabricStrategy().save_checkpoint(tmp_path / "ckpt", {}, storage_options={})


@pytest.mark.parametrize("state", [{}, {"model": nn.Linear(3, 3)}])
def test_fabric_save_without_a_set_up_model_is_refused(state: dict, tmp_path: Path) -> None:
    """fabric::test_save_checkpoint_one_fsdp_module_required (no model)"""
    with pytest.raises(ValueError, match="Could not find a FSDP model in the provided checkpoint state"):
        FSDP2FabricStrategy().save_checkpoint(tmp_path / "ckpt", state)


@pytest.mark.parametrize("state", [None, {}])
def test_fabric_load_needs_the_objects_to_restore(state: Any, tmp_path: Path) -> None:
    """fabric::test_load_checkpoint_no_state"""
    with pytest.raises(ValueError, match=r"Got FSDPStrategy\.load_checkpoint\(\.\.\., state="):
        FSDP2FabricStrategy().load_checkpoint(tmp_path, state=state)


@pytest.mark.parametrize("state", [{"other": "data"}, {"model": nn.Linear(3, 3)}])
def test_fabric_load_without_a_set_up_model_is_refused(state: dict, tmp_path: Path) -> None:
    """fabric::test_load_checkpoint_one_fsdp_module_required (no model)"""
    with pytest.raises(ValueError, match="Could not find a FSDP model in the provided checkpoint state"):
        FSDP2FabricStrategy().load_checkpoint(tmp_path, state=state)


def test_fabric_load_of_an_optimizer_alone_is_not_supported(tmp_path: Path) -> None:
    """fabric::test_load_raw_checkpoint_optimizer_unsupported"""
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(NotImplementedError, match=r"a single optimizer object.*fabric.load\(path, \{'model'"):
        FSDP2FabricStrategy().load_checkpoint(tmp_path / "optimizer.pt", state=optimizer)


# -- a real FSDP2 model on one CPU process -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded_checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("sharded_checks")
    environment = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, __file__, str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, env={**_environ(), **environment}, timeout=600)
    assert result.returncode == 0, f"the checks failed to run:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return json.loads((folder / "results.json").read_text())


def _environ() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}


def test_the_timeout_reaches_the_process_group(sharded_checks: dict[str, Any]) -> None:
    """pytorch:: and fabric::test_set_timeout (the Trainer strategy joins the group through the same mixin)"""
    assert sharded_checks["process_group_timeout"] == 77


def test_checkpoint_state_with_two_models_is_refused(sharded_checks: dict[str, Any]) -> None:
    """fabric::test_save_checkpoint_one_fsdp_module_required, fabric::test_load_checkpoint_one_fsdp_module_required
    (several models)"""
    for method in ("save", "load"):
        assert sharded_checks[f"two_models_{method}"].startswith(
            "ValueError: Found multiple FSDP models in the given state."
        )


def test_saving_over_existing_paths(sharded_checks: dict[str, Any]) -> None:
    """pytorch:: and fabric::test_save_checkpoint_path_exists"""
    outcome = sharded_checks["save_over"]
    assert outcome["full over a folder that is no checkpoint"].startswith("IsADirectoryError")
    assert outcome["full over a sharded checkpoint"] == "file"
    assert outcome["full over a file"] == "file"
    assert outcome["sharded over a file"] == "folder"
    # Lightning writes into the folder, next to what is there; ours refuses, keeping the user's files (intended).
    assert outcome["sharded over a folder that is no checkpoint"].startswith("IsADirectoryError")
    assert outcome["the user's file is kept"] is True


def test_a_folder_without_a_checkpoint_is_refused(sharded_checks: dict[str, Any]) -> None:
    """pytorch:: and fabric::test_load_unknown_checkpoint_type"""
    assert sharded_checks["load_empty_folder_is_value_error"] is True, sharded_checks["load_empty_folder"]


def test_load_raw_reads_a_plain_state_dict_file(sharded_checks: dict[str, Any]) -> None:
    """fabric::test_load_checkpoint_one_fsdp_module_required ("a raw nn.Module instead of a dictionary is ok")"""
    assert sharded_checks["load_raw_restored"] is True


def test_load_raw_of_a_folder_is_refused(sharded_checks: dict[str, Any]) -> None:
    """fabric::test_load_raw_checkpoint_validate_single_file"""
    assert sharded_checks["load_raw_folder_is_value_error"] is True, sharded_checks["load_raw_folder"]


def test_a_requested_key_the_checkpoint_lacks_is_refused_unless_loading_is_not_strict(
    sharded_checks: dict[str, Any],
) -> None:
    """fabric::test_fsdp_integration.py::test_train_save_load (a key not in the checkpoint), in Lightning's words"""
    from lightning.fabric.strategies.strategy import _validate_keys_for_strict_loading

    lightnings = error_of(lambda: _validate_keys_for_strict_loading(["coconut"], [], strict=True))
    assert sharded_checks["load_unknown_key"] == lightnings
    assert sharded_checks["load_unknown_key_not_strict"] == {"coconut": 11}


def _run_sharded_checks(folder: Path) -> None:
    """One CPU process over gloo: a real FSDP2 model, and the checkpoint paths Lightning's tests mock."""
    from lightning.fabric import Fabric

    results: dict[str, Any] = {}

    fabric = Fabric(accelerator="cpu", devices=1, strategy=FSDP2FabricStrategy(timeout=timedelta(seconds=77)))
    fabric.launch()
    world = torch.distributed.distributed_c10d._get_default_group()
    results["process_group_timeout"] = world._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    fabric.seed_everything(5)
    strategy = fabric.strategy
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    second = nn.Linear(4, 2)
    other, _ = fabric.setup(second, torch.optim.SGD(second.parameters(), lr=0.1))
    for method in ("save", "load"):
        call = getattr(fabric, method)
        results[f"two_models_{method}"] = error_of(
            lambda call=call: call(folder / "two.ckpt", {"a": model, "b": other})
        )

    state = {"model": model, "optimizer": optimizer}
    outcome: dict[str, Any] = {}

    def save_over(label: str, path: Path, kind: str) -> None:
        strategy.state_dict_type = kind
        error = error_of(lambda: fabric.save(path, state))
        outcome[label] = error if error != "no error" else ("folder" if path.is_dir() else "file")

    user_folder = folder / "outputs"
    user_folder.mkdir()
    (user_folder / "results.csv").write_text("keep me")
    save_over("full over a folder that is no checkpoint", user_folder, "full")
    save_over("sharded over a folder that is no checkpoint", user_folder, "sharded")
    outcome["the user's file is kept"] = (user_folder / "results.csv").read_text() == "keep me"
    strategy.state_dict_type = "sharded"
    fabric.save(folder / "sharded.ckpt", state)
    save_over("full over a sharded checkpoint", folder / "sharded.ckpt", "full")
    save_over("full over a file", folder / "sharded.ckpt", "full")
    save_over("sharded over a file", folder / "sharded.ckpt", "sharded")
    results["save_over"] = outcome

    unknown = {"model": model, "coconut": 11}
    results["load_unknown_key"] = error_of(lambda: fabric.load(folder / "sharded.ckpt", unknown))
    fabric.load(folder / "sharded.ckpt", unknown, strict=False)
    results["load_unknown_key_not_strict"] = {"coconut": unknown["coconut"]}

    empty = folder / "empty"
    empty.mkdir()
    error = raised_by(lambda: fabric.load(empty, state))
    results["load_empty_folder"] = described(error)
    results["load_empty_folder_is_value_error"] = isinstance(error, ValueError)

    plain = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    torch.save(plain.state_dict(), folder / "plain.pt")
    fabric.load_raw(folder / "plain.pt", model)
    full = {name: tensor.full_tensor() for name, tensor in model.state_dict().items()}
    results["load_raw_restored"] = all(torch.equal(full[name], value) for name, value in plain.state_dict().items())
    error = raised_by(lambda: fabric.load_raw(user_folder, model))
    results["load_raw_folder"] = described(error)
    results["load_raw_folder_is_value_error"] = isinstance(error, ValueError)

    (folder / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    _run_sharded_checks(Path(sys.argv[1]))
