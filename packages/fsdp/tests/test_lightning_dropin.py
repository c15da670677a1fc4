"""Drop-in for Lightning's FSDPStrategy (issue 16): what it resumes, ours resumes; what it refuses, ours refuses;
a CheckpointIO plugin writes full checkpoints; Fabric sets up a model and its optimizer together; the attributes
users read from Lightning's strategy exist.

The optimizer is plain SGD, as in Lightning's BoringModel: it keeps no per-parameter state, only hyperparameters
(the first run's lr is 0.05, a fresh module's 0.01, so ``lr`` tells whether the optimizer state was loaded).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import read, run_group

from lightning_strategies_fsdp.checkpoint import (
    OptimizerStatesError,
    check_optimizer_states,
    warn_if_checkpoint_io_unused,
)


@pytest.fixture(scope="module")
def dropin_run(scenario_root: Path) -> Path:
    # The watchdog would end a rank once the other reports the refused checkpoint; here both are caught.
    return run_group("dropin", scenario_root / "dropin", env={"LIGHTNING_STRATEGIES_FAILED_RANK_TIMEOUT": "0"})


@pytest.mark.parametrize(
    "label",
    [
        "full",  # state_dict_type="full": torch's "Expected device to be set" before
        "sharded",
        "converted",  # sharded -> full with the converter: KeyError 'param_groups.<name>.lr' before
        "ddp",  # a DDP checkpoint: optimizer state keyed by position, no tensors
        "full_by_ddp",  # the other way: Trainer(strategy="ddp") resumes our full checkpoint
    ],
)
def test_resumes_checkpoints_of_an_optimizer_without_state(dropin_run: Path, label: str) -> None:
    result = read(dropin_run, "dropin_resume")[label]
    assert result["weights_equal_saved"]
    assert result["lr"] == 0.05
    assert result["global_step"] == 4


@pytest.mark.parametrize("kind", ["sharded", "full"])
def test_fit_refuses_a_checkpoint_without_optimizer_states(dropin_run: Path, kind: str) -> None:
    """Lightning refuses to resume training from a weights-only checkpoint; ours said "Restored all states"."""
    refusals = read(dropin_run, "dropin_refusals")
    assert refusals[f"fit_{kind}"].startswith("OptimizerStatesError: ")
    assert "no optimizer states" in refusals[f"fit_{kind}"]
    assert "Load only the weights instead" in refusals[f"fit_{kind}"]
    # Evaluation needs no optimizer: the same checkpoint loads.
    assert refusals[f"validate_{kind}"] is None


def test_fit_refuses_edited_checkpoints_as_lightning_does(dropin_run: Path) -> None:
    """A full checkpoint whose optimizer states were removed (its schedulers' kept), and one with the states of
    two optimizers for a module with one: ours resumed both and said "Restored all states"."""
    refusals = read(dropin_run, "dropin_refusals")
    assert refusals["fit_no_optimizer_states"].startswith("OptimizerStatesError: ")
    assert "no optimizer states" in refusals["fit_no_optimizer_states"]
    assert refusals["fit_two_optimizers"].startswith("OptimizerStatesError: ")
    assert "configured 1 optimizers but the checkpoint contains 2 optimizers" in refusals["fit_two_optimizers"]


def test_another_number_of_optimizers_is_refused(tmp_path: Path) -> None:
    optimizers = {"optimizer_0": torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)}
    with pytest.raises(OptimizerStatesError, match="configured 1 optimizers but the checkpoint contains 2") as error:
        check_optimizer_states(tmp_path, ["state_dict", "optimizer_0", "optimizer_1"], optimizers, all_optimizers=True)
    # Lightning's FSDPStrategy raises RuntimeError here and KeyError for missing states: both still catch it.
    assert isinstance(error.value, RuntimeError) and isinstance(error.value, KeyError)
    with pytest.raises(OptimizerStatesError, match="no optimizer state under \\['optimizer'\\]"):
        check_optimizer_states(tmp_path, ["model"], {"optimizer": optimizers["optimizer_0"]}, all_optimizers=False)


def test_checkpoint_io_writes_and_reads_full_checkpoints(dropin_run: Path) -> None:
    result = read(dropin_run, "dropin_checkpoint_io")
    assert result["save_calls"] == ["save"]
    assert result["load_calls"] == ["load"]
    assert result["weights_equal_saved"]
    assert result["global_step"] == 4


def test_a_custom_checkpoint_io_is_told_it_has_no_part_in_sharded_checkpoints() -> None:
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class RemoteCheckpointIO(TorchCheckpointIO):
        pass

    with pytest.warns(UserWarning, match="RemoteCheckpointIO plugin is used for state_dict_type='full' only"):
        warn_if_checkpoint_io_unused(RemoteCheckpointIO())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_checkpoint_io_unused(TorchCheckpointIO())  # Lightning's default: nothing to tell
        warn_if_checkpoint_io_unused(None)


def test_fabric_checkpoint_io_writes_and_reads_full_checkpoints(fabric_run: Path) -> None:
    result = read(fabric_run, "fabric_checkpoint_io")
    assert result["calls"] == ["save", "load"]
    assert result["loaded_weights_equal"]


def test_fabric_sets_up_model_and_optimizer_together(fabric_run: Path) -> None:
    result = read(fabric_run, "fabric_joint_setup")
    assert result["optimizer_holds_the_sharded_parameters"]
    assert result["weights_changed"]
    assert result["losses"][-1] < result["losses"][0]


def test_fabric_setup_refuses_an_optimizer_that_stepped() -> None:
    from lightning_strategies_fsdp.fabric import _check_rebindable

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match="has state already"):
        _check_rebindable(optimizer, {param: name for name, param in model.named_parameters()})
    other = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="2 parameter\\(s\\) that are not the model's"):
        _check_rebindable(other, {param: name for name, param in model.named_parameters()})


def test_fabric_attributes(fabric_run: Path) -> None:
    assert read(fabric_run, "fabric_attributes") == {
        "sharding_strategy": "<ShardingStrategy.FULL_SHARD: 1>",
        "cpu_offload": "CPUOffload(offload_params=False)",
        "mixed_precision_config": "None",
    }


def test_trainer_attributes_read_as_lightning_fsdp_strategy() -> None:
    import lightning.pytorch as pl
    from torch.distributed.fsdp import CPUOffload, MixedPrecisionPolicy, ShardingStrategy

    from lightning_strategies_fsdp.strategy import FSDP2Strategy

    default = FSDP2Strategy()
    assert default.sharding_strategy is ShardingStrategy.FULL_SHARD
    assert default.cpu_offload == CPUOffload(offload_params=False)
    assert default.mixed_precision_config is None

    policy = MixedPrecisionPolicy(param_dtype=torch.float16)
    given = FSDP2Strategy(sharding_strategy="shard_grad_op", cpu_offload=True, mixed_precision=policy)
    assert given.sharding_strategy is ShardingStrategy.SHARD_GRAD_OP
    assert given.cpu_offload.offload_params is True
    assert given.mixed_precision_config is policy
    assert given.mixed_precision is policy

    # Without mixed_precision: the policy the precision flag implies.
    trainer = pl.Trainer(strategy="fsdp_hybrid_shard", accelerator="cpu", devices=1, precision="bf16-mixed")
    assert trainer.strategy.sharding_strategy is ShardingStrategy.HYBRID_SHARD
    assert trainer.strategy.mixed_precision_config.param_dtype == torch.bfloat16
    assert trainer.strategy.mixed_precision_config.reduce_dtype == torch.float32
    assert pl.Trainer(strategy="fsdp_cpu_offload", accelerator="cpu", devices=1).strategy.cpu_offload.offload_params


@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_validate_test_and_predict_each_load_their_checkpoint_on_one_trainer(dropin_run: Path, kind: str) -> None:
    """Issue 29, item 6: after validate the root keeps its unsharded parameters, and the next full checkpoint load
    failed with "aten.copy_.default got mixed torch.Tensor and DTensor". Each call's loss or predictions must be
    those of the model that saved the checkpoint it named (True), not an error."""
    results = read(dropin_run, "dropin_repeated_loads")
    loads = {name: result for name, result in results.items() if name.startswith(kind)}
    assert len(loads) == 6
    assert all(result is True for result in loads.values()), loads


@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_a_checkpoint_holding_objects_is_refused_with_advice_that_works(dropin_run: Path, kind: str) -> None:
    """Issue 29, item 5: the refusal told users to pass weights_only=False to trainer.fit, which Lightning 2.6 drops
    for strategies that load checkpoints after setup (validate/test/predict too). Should Lightning pass it on one
    day, the weights_only=False loads below succeed and this test says the advice can name the Trainer again."""
    found = read(dropin_run, "dropin_trusted_objects")
    for call in ("fit", "validate"):
        refusal = found[f"{call}_{kind}_weights_only_false"]
        assert refusal is not None and "weights_only=True refuses" in refusal, refusal
        assert "add_safe_globals" in refusal
        assert "weights_only=False to trainer" not in refusal
        assert found[f"{call}_{kind}_safe_globals"] is None  # what the refusal advises works
