"""What Lightning's own DeepSpeed tests check on CPU, checked on ours (issue 16, item 3).

Each test names the Lightning test it answers (tests/tests_pytorch/strategies/test_deepspeed.py, "pytorch::",
and tests/tests_fabric/strategies/test_deepspeed.py, "fabric::"). docs/lightning-compatibility.md maps every
one of Lightning's tests to ours, or to the difference we intend. Lightning checks its checkpoint handling
against mocked engines; ours are checked against a real engine, built once on one CPU process by running this
file as a script (``python test_lightning_behaviours.py OUT``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.fabric.strategies import DeepSpeedStrategy as LightningFabricDeepSpeedStrategy
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeedStrategy
from torch import nn

from lightning_strategies.testing import described, error_of, raised_by
from lightning_strategies_deepspeed import config as settings
from lightning_strategies_deepspeed.fabric import DeepSpeedFabricStrategy
from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy

BOTH = pytest.mark.parametrize("strategy_class", [DeepSpeedStrategy, DeepSpeedFabricStrategy])


# -- constructor, attributes and config: no backend needed ---------------------------------------------------


@pytest.mark.parametrize("given", ["name", "instance"])
def test_name_or_instance_gives_our_strategy_on_the_cpu(given: str) -> None:
    """pytorch::test_deepspeed_strategy_string"""
    trainer = Trainer(accelerator="cpu", strategy="deepspeed" if given == "name" else DeepSpeedStrategy(), logger=False)
    assert isinstance(trainer.strategy, DeepSpeedStrategy)
    assert isinstance(trainer.strategy, LightningDeepSpeedStrategy)
    assert trainer.strategy.parallel_devices == [torch.device("cpu")]


def test_config_path_variable_reaches_the_named_strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytorch::test_deepspeed_strategy_env"""
    config = {"train_batch_size": 4, "zero_optimization": {"stage": 3}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv(settings.CONFIG_PATH_VARIABLE, str(path))
    trainer = Trainer(accelerator="cpu", strategy="deepspeed", logger=False)
    assert trainer.strategy.parallel_devices == [torch.device("cpu")]
    assert trainer.strategy.config == config


@BOTH
def test_config_path_variable_is_read_by_the_constructor(strategy_class: type, tmp_path: Path, monkeypatch) -> None:
    """pytorch:: and fabric::test_deepspeed_with_env_path"""
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv(settings.CONFIG_PATH_VARIABLE, str(path))
    assert strategy_class().config == config


@BOTH
def test_defaults_build_a_zero_config(strategy_class: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytorch:: and fabric::test_deepspeed_defaults"""
    monkeypatch.delenv(settings.CONFIG_PATH_VARIABLE, raising=False)
    strategy = strategy_class()
    assert isinstance(strategy.config["zero_optimization"], dict)
    assert strategy.config["zero_optimization"]["stage"] == 2
    if strategy_class is DeepSpeedFabricStrategy:
        # No reduction to skip: fabric.no_backward_sync warns and goes on, as with Lightning's.
        assert strategy._backward_sync_control is None


@BOTH
def test_loss_scaling_arguments_are_attributes_as_on_lightnings(strategy_class: type) -> None:
    """Lightning's DeepSpeed strategies keep their fp16 loss-scaling arguments as public attributes, read when the
    config is completed at set-up (so a value set before fit counts), and name the config-path variable in
    DEEPSPEED_ENV_VAR. Ours had none of them."""
    given = {"loss_scale": 128, "initial_scale_power": 8, "loss_scale_window": 500, "hysteresis": 3}
    given["min_loss_scale"] = 2
    strategy = strategy_class(**given)
    assert {name: getattr(strategy, name) for name in given} == given
    for lightnings in (LightningDeepSpeedStrategy, LightningFabricDeepSpeedStrategy):
        assert strategy_class.DEEPSPEED_ENV_VAR == lightnings.DEEPSPEED_ENV_VAR
    strategy.loss_scale = 64
    config: dict[str, Any] = {}
    settings.add_precision(config, "16-mixed", strategy.parameters)  # what set-up does with them
    assert config["fp16"]["loss_scale"] == 64 and config["fp16"]["loss_scale_window"] == 500
    with pytest.raises(ValueError, match="must be 0 or more"):
        strategy.loss_scale = -1
    assert strategy.loss_scale == 64


@BOTH
def test_activation_checkpointing_parameters_reach_the_config(strategy_class: type) -> None:
    """pytorch:: and fabric::test_deepspeed_custom_activation_checkpointing_params"""
    names = ("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization")
    names += ("synchronize_checkpoint_boundary",)
    assert not any(strategy_class().config["activation_checkpointing"][name] for name in names)
    strategy = strategy_class(**dict.fromkeys(names, True))
    assert all(strategy.config["activation_checkpointing"][name] is True for name in names)


@BOTH
def test_optimizer_offload_from_the_parameter_or_the_config(strategy_class: type) -> None:
    """fabric::test_deepspeed_config_zero_offload"""
    assert "offload_optimizer" not in strategy_class().config["zero_optimization"]
    given = {"zero_allow_untested_optimizer": True, "zero_optimization": {"stage": 2}}
    assert "offload_optimizer" not in strategy_class(config=given).config["zero_optimization"]
    offloaded = strategy_class(offload_optimizer=True).config["zero_optimization"]["offload_optimizer"]
    assert offloaded == {"device": "cpu", "nvme_path": "/local_nvme", "buffer_count": 4, "pin_memory": False}
    given["zero_optimization"]["offload_optimizer"] = False
    assert strategy_class(config=given).config["zero_optimization"]["offload_optimizer"] is False


@BOTH
@pytest.mark.parametrize("exclude", [True, False])
def test_exclude_frozen_parameters_is_kept(strategy_class: type, exclude: bool) -> None:
    """fabric::test_deepspeed_save_checkpoint_exclude_frozen_parameters (the attribute; the file: below)"""
    assert strategy_class().exclude_frozen_parameters is False
    assert strategy_class(exclude_frozen_parameters=exclude).exclude_frozen_parameters is exclude


# -- errors for bad input ------------------------------------------------------------------------------------


def test_model_and_optimizer_are_set_up_together() -> None:
    """fabric::test_deepspeed_requires_joint_setup"""
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(NotImplementedError, match=r"use fabric\.setup\(model, optimizer\)"):
        DeepSpeedFabricStrategy().setup_optimizer(optimizer)


def test_clipping_by_the_strategy_is_refused_with_the_config_key() -> None:
    """fabric::test_errors_grad_clipping"""
    strategy = DeepSpeedFabricStrategy()
    with pytest.raises(NotImplementedError, match="gradient_clipping"):
        strategy.clip_gradients_norm(nn.Linear(2, 2), None, 1.0)
    with pytest.raises(NotImplementedError, match="global norm only"):
        strategy.clip_gradients_value(nn.Linear(2, 2), None, 1.0)


@pytest.mark.parametrize("argument", ["storage_options", "filter"])
def test_fabric_save_refuses_storage_options_and_filter(argument: str, tmp_path: Path) -> None:
    """fabric::test_deepspeed_save_checkpoint_storage_options, fabric::test_deepspeed_save_filter"""
    with pytest.raises(TypeError, match="DeepSpeed writes its own files"):
        DeepSpeedFabricStrategy().save_checkpoint(path=tmp_path, state={}, **{argument: {}})


def test_trainer_save_refuses_storage_options(tmp_path: Path) -> None:
    """pytorch:: (Trainer side of fabric::test_deepspeed_save_checkpoint_storage_options)"""
    with pytest.raises(TypeError, match=r"`Trainer\.save_checkpoint\(\.\.\., storage_options=\.\.\.\)` with"):
        DeepSpeedStrategy().save_checkpoint({}, tmp_path / "ckpt", storage_options={})


@pytest.mark.parametrize("state", [None, {}])
def test_fabric_load_needs_the_objects_to_restore(state: Any, tmp_path: Path) -> None:
    """fabric::test_deepspeed_load_checkpoint_no_state"""
    with pytest.raises(ValueError, match=r"a state with at least  a model instance.*fabric\.load\(path"):
        DeepSpeedFabricStrategy().load_checkpoint(path=tmp_path, state=state)


@pytest.mark.parametrize(
    ("method", "state"),
    [
        ("save_checkpoint", {}),
        ("save_checkpoint", {"model": nn.Linear(3, 3)}),
        ("load_checkpoint", {"model": nn.Linear(3, 3)}),
        ("load_checkpoint", {"other": "data"}),  # an empty state is the "no state" case above
    ],
)
def test_fabric_checkpoint_state_without_an_engine_is_refused(method: str, state: dict, tmp_path: Path) -> None:
    """fabric::test_deepspeed_save_checkpoint_one_deepspeed_engine_required and the load twin (no engine)"""
    if method == "load_checkpoint":  # the path is checked first, as by Lightning's strategy: a checkpoint folder
        (tmp_path / "checkpoint").mkdir()
        (tmp_path / "latest").write_text("checkpoint")
        torch.save({"dp_world_size": 1}, tmp_path / "checkpoint" / "mp_rank_00_model_states.pt")
    with pytest.raises(ValueError, match="Could not find a DeepSpeed model in the provided checkpoint state"):
        getattr(DeepSpeedFabricStrategy(), method)(path=tmp_path, state=state)


def test_trainer_load_of_a_folder_without_a_checkpoint_is_a_file_not_found_error(tmp_path: Path) -> None:
    """pytorch::test_deepspeed_load_checkpoint_validate_path (a folder holding no checkpoint)"""
    with pytest.raises(FileNotFoundError, match="DeepSpeedStrategy reads a DeepSpeed checkpoint directory"):
        DeepSpeedStrategy().load_checkpoint(tmp_path)
    (tmp_path / "checkpoint").mkdir()  # Lightning's case: the tag folder, here without the engine's files
    with pytest.raises(FileNotFoundError, match="DeepSpeedStrategy reads a DeepSpeed checkpoint directory"):
        DeepSpeedStrategy().load_checkpoint(tmp_path / "checkpoint")


def test_trainer_load_of_a_single_file_or_a_missing_path_is_a_file_not_found_error(tmp_path: Path) -> None:
    """pytorch::test_deepspeed_load_checkpoint_validate_path: Lightning's strategy raises FileNotFoundError for any
    path that is no DeepSpeed checkpoint directory; ours for a checkpoint file of another strategy, and for a
    path that does not exist, too, in Lightning's words first (test_lightning_words.py), then its own."""
    torch.save({"state_dict": {}}, tmp_path / "ddp.ckpt")
    with pytest.raises(FileNotFoundError, match=r"is a single torch\.save checkpoint file"):
        DeepSpeedStrategy().load_checkpoint(tmp_path / "ddp.ckpt")
    with pytest.raises(FileNotFoundError, match="No checkpoint at"):
        DeepSpeedStrategy().load_checkpoint(tmp_path / "missing")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fabric_loads_plain_state_dicts_into_a_module_and_an_optimizer(stage: int, tmp_path: Path) -> None:
    """fabric::test_deepspeed_load_checkpoint_raw_state_dict"""
    saved_model = nn.Linear(3, 3)
    saved_optimizer = torch.optim.Adam(saved_model.parameters(), lr=1.0)
    torch.save(saved_model.state_dict(), tmp_path / "model.pt")
    torch.save(saved_optimizer.state_dict(), tmp_path / "optimizer.pt")
    model = nn.Linear(3, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=2.0)
    strategy = DeepSpeedFabricStrategy(stage=stage)
    strategy.load_checkpoint(tmp_path / "model.pt", state=model, strict=False)
    strategy.load_checkpoint(tmp_path / "optimizer.pt", state=optimizer, strict=False)
    assert torch.equal(model.weight, saved_model.weight)
    assert optimizer.param_groups[0]["lr"] == 1.0


# -- a real engine on one CPU process ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from conftest import clean_environment

    folder = tmp_path_factory.mktemp("engine_checks")
    environment = {**clean_environment(), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, f"the checks failed to run:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return json.loads((folder / "results.json").read_text())


def test_fabric_sets_up_a_model_without_an_optimizer(engine_checks: dict[str, Any]) -> None:
    """fabric::test_deepspeed_setup_module (and test_deepspeed_only_compatible_with_cuda: ours runs on CPU)"""
    assert engine_checks["setup_module"] == {"engine": "DeepSpeedEngine", "optimizer": None}


def test_checkpoint_state_with_two_engines_is_refused(engine_checks: dict[str, Any]) -> None:
    """fabric::test_deepspeed_save_checkpoint_one_deepspeed_engine_required,
    fabric::test_deepspeed_load_checkpoint_one_deepspeed_engine_required (several engines)"""
    for method in ("save", "load"):
        assert engine_checks[f"two_engines_{method}"].startswith(
            "ValueError: Found multiple DeepSpeed engine modules in the given state."
        )


def test_the_client_state_holds_neither_engine_nor_optimizer(engine_checks: dict[str, Any]) -> None:
    """fabric::test_deepspeed_save_checkpoint_client_state_separation"""
    assert "note" in engine_checks["client_state_keys"]
    assert engine_checks["client_state_objects"] == []


def test_another_strategys_file_loaded_with_two_optimizers_is_refused_in_words(engine_checks: dict[str, Any]) -> None:
    """Not in Lightning (its DeepSpeed load reads no other strategy's file): the engine has one optimizer."""
    assert engine_checks["foreign_two_optimizers"].startswith(
        "ValueError: The state to load holds several optimizers ('optimizer', 'other')"
    ), engine_checks["foreign_two_optimizers"]


def test_a_trainer_checkpoint_loaded_by_fabric_is_refused_as_the_trainers(engine_checks: dict[str, Any]) -> None:
    """Not in Lightning: the refusal names the Trainer's layout and its resume, not missing optimizer states."""
    assert engine_checks["foreign_trainer_layout"].startswith(
        "CheckpointError: The checkpoint has no 'model' entry (it holds ['optimizer_states', "
        "'pytorch-lightning_version', 'state_dict']): it is in the Trainer's layout: resume it with "
        "trainer.fit(model, ckpt_path=path)."
    ), engine_checks["foreign_trainer_layout"]


def test_load_updates_the_state_and_returns_the_rest(engine_checks: dict[str, Any]) -> None:
    """fabric::test_deepspeed_load_checkpoint_state_updated_with_client_state"""
    assert engine_checks["loaded_note"] == {"iteration": 5}
    assert engine_checks["weights_restored"] is True
    assert "note" not in engine_checks["remainder_keys"]
    assert not {"model", "optimizer"} & set(engine_checks["remainder_keys"])


def test_optimizer_state_is_loaded_only_when_asked_for(engine_checks: dict[str, Any]) -> None:
    """fabric::test_deepspeed_load_checkpoint_optimzer_state_requested"""
    saved, later = engine_checks["optimizer_saved"], engine_checks["optimizer_later"]
    assert saved != later  # the step between save and load changed the optimizer's state
    assert engine_checks["optimizer_after_model_only_load"] == later
    assert engine_checks["optimizer_after_full_load"] == saved


def test_frozen_parameters_are_left_out_of_the_file_when_asked(engine_checks: dict[str, Any]) -> None:
    """fabric::test_deepspeed_save_checkpoint_exclude_frozen_parameters (what the file holds)"""
    assert "0.weight" in engine_checks["saved_module_keys"]["False"]
    assert "0.weight" not in engine_checks["saved_module_keys"]["True"]
    assert "1.weight" in engine_checks["saved_module_keys"]["True"]


def test_a_folder_without_a_checkpoint_is_a_file_not_found_error(engine_checks: dict[str, Any]) -> None:
    """fabric::test_deepspeed_load_checkpoint_validate_path,
    fabric::test_deepspeed_load_checkpoint_client_state_missing"""
    assert engine_checks["load_empty_folder"].startswith("CheckpointNotFoundError")
    assert engine_checks["load_empty_folder_is_file_not_found"] is True


def test_the_tag_folder_or_a_file_in_it_loads_the_checkpoint(engine_checks: dict[str, Any]) -> None:
    """fabric::test_deepspeed_load_checkpoint_validate_path: Lightning refuses these paths and names the parent
    directory; ours loads from them (an intended difference, docs/lightning-compatibility.md)."""
    assert engine_checks["load_from_tag_folder"] is True
    assert engine_checks["load_from_file_in_tag_folder"] is True


def _run_engine_checks(folder: Path) -> None:
    """One CPU process: a real engine, its checkpoints, and what Lightning's tests check with mocks."""
    from lightning.fabric import Fabric

    results: dict[str, Any] = {}

    fabric = Fabric(accelerator="cpu", devices=1, strategy=DeepSpeedFabricStrategy(stage=2))
    fabric.launch()
    fabric.seed_everything(7)
    strategy = fabric.strategy
    assert isinstance(strategy, LightningFabricDeepSpeedStrategy)

    evaluated = fabric.setup_module(nn.Linear(4, 2))
    engine = evaluated._forward_module
    results["setup_module"] = {"engine": type(engine).__name__, "optimizer": engine.optimizer}

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    model, optimizer = fabric.setup(model, torch.optim.Adam(model[1].parameters(), lr=0.1))
    second = nn.Linear(4, 2)
    other, other_optimizer = fabric.setup(second, torch.optim.SGD(second.parameters(), lr=0.1))
    inputs = torch.randn(8, 4)

    def step() -> None:
        fabric.backward(model(inputs).square().mean(), model=model)
        optimizer.step()

    def adam_state() -> list[float]:
        inner = optimizer.optimizer.optimizer  # Fabric's wrapper, the ZeRO optimizer, then torch's Adam
        return [round(value["exp_avg"].sum().item(), 6) for value in inner.state.values()]

    results["two_engines_save"] = error_of(lambda: fabric.save(folder / "two.ckpt", {"a": model, "b": other}))

    step()
    checkpoint = folder / "run.ckpt"
    fabric.save(checkpoint, {"model": model, "optimizer": optimizer, "note": {"iteration": 5}})
    # Loading checks the path before the state, as Lightning's strategy does: a checkpoint that is there.
    results["two_engines_load"] = error_of(lambda: fabric.load(checkpoint, {"a": model, "b": other}))
    saved_weights = [parameter.detach().clone() for parameter in model.parameters()]
    results["optimizer_saved"] = adam_state()
    client_state = torch.load(checkpoint / "checkpoint" / "mp_rank_00_model_states.pt", weights_only=False)
    results["client_state_keys"] = sorted(client_state)
    results["client_state_objects"] = sorted(
        key for key, value in client_state.items() if isinstance(value, (nn.Module, torch.optim.Optimizer))
    )

    step()
    results["optimizer_later"] = adam_state()
    fabric.load(checkpoint, {"model": model})
    results["optimizer_after_model_only_load"] = adam_state()
    state = {"model": model, "optimizer": optimizer, "note": {"iteration": 0}}
    remainder = fabric.load(checkpoint, state)
    results["optimizer_after_full_load"] = adam_state()
    results["loaded_note"] = state["note"]
    results["remainder_keys"] = sorted(remainder)
    results["weights_restored"] = all(
        torch.equal(before, after) for before, after in zip(saved_weights, model.parameters(), strict=True)
    )

    tag_folder = checkpoint / "checkpoint"
    for tag_path, key in (
        (tag_folder, "load_from_tag_folder"),
        (tag_folder / "mp_rank_00_model_states.pt", "load_from_file_in_tag_folder"),
    ):
        step()
        fabric.load(tag_path, {"model": model, "optimizer": optimizer})
        results[key] = all(
            torch.equal(before, after) for before, after in zip(saved_weights, model.parameters(), strict=True)
        )

    # Another strategy's one-file checkpoint, loaded with a second engine's optimizer in the state by mistake.
    torch.save({"model": model.state_dict(), "optimizer": {}}, folder / "plain.pt")
    state = {"model": model, "optimizer": optimizer, "other": other_optimizer}
    results["foreign_two_optimizers"] = error_of(lambda: fabric.load(folder / "plain.pt", state))
    # A file in the Trainer's layout, its optimizer states under "optimizer_states".
    trainer_file = folder / "trainer.ckpt"
    torch.save({"state_dict": model.state_dict(), "optimizer_states": [{}], "pytorch-lightning_version": "2.6.6"},
               trainer_file)  # fmt: skip
    with_optimizer = {"model": model, "optimizer": optimizer}
    results["foreign_trainer_layout"] = error_of(lambda: fabric.load(trainer_file, with_optimizer))

    empty = folder / "empty"
    (empty / "checkpoint").mkdir(parents=True)
    error = raised_by(lambda: fabric.load(empty, {"model": model}))
    results["load_empty_folder"] = described(error)
    results["load_empty_folder_is_file_not_found"] = isinstance(error, FileNotFoundError)

    results["saved_module_keys"] = {}
    for exclude in (False, True):
        strategy.exclude_frozen_parameters = exclude
        path = folder / f"exclude-{exclude}.ckpt"
        fabric.save(path, {"model": model, "optimizer": optimizer})
        saved = torch.load(path / "checkpoint" / "mp_rank_00_model_states.pt", weights_only=False)
        results["saved_module_keys"][str(exclude)] = sorted(saved["module"])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (folder / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    _run_engine_checks(Path(sys.argv[1]))
