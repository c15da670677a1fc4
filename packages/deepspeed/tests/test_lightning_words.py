"""Lightning's words first (issue 32): for each input Lightning's DeepSpeed strategies refuse on CPU, ours raise the
same type (or a subclass) with a message that begins with Lightning's, then say what to do with ours.

Each test runs Lightning's class and ours on the same input and reads Lightning's text from the installed Lightning
(``assert_raises_as_lightning``), so a ``pytest.raises(..., match=...)`` written against Lightning passes on ours.
Where ours refuses what Lightning accepts, or accepts what it refuses, docs/lightning-compatibility.md says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest
import torch
from lightning.fabric.accelerators import CUDAAccelerator as FabricCUDAAccelerator
from lightning.fabric.accelerators import MPSAccelerator as FabricMPSAccelerator
from lightning.fabric.plugins.precision import DeepSpeedPrecision as LightningFabricDeepSpeedPrecision
from lightning.fabric.strategies import DeepSpeedStrategy as LightningFabricDeepSpeedStrategy
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator
from lightning.pytorch.plugins.precision import DeepSpeedPrecision as LightningDeepSpeedPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeedStrategy
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import nn

from lightning_strategies import CheckpointError
from lightning_strategies.testing import assert_raises_as_lightning
from lightning_strategies_deepspeed.fabric import DeepSpeedFabricPrecision, DeepSpeedFabricStrategy
from lightning_strategies_deepspeed.precision import DeepSpeedPrecision
from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy

TRAINER = (LightningDeepSpeedStrategy, DeepSpeedStrategy)
FABRIC = (LightningFabricDeepSpeedStrategy, DeepSpeedFabricStrategy)
BOTH = pytest.mark.parametrize(("lightnings", "ours"), [TRAINER, FABRIC], ids=["trainer", "fabric"])


def _engine() -> Any:
    """What both strategies take for a model set up through them: a DeepSpeedEngine (one that loads nothing)."""
    from deepspeed import DeepSpeedEngine

    engine = Mock(spec=DeepSpeedEngine)
    engine.modules.return_value = [engine]  # Lightning looks for engines among the state's modules
    engine.load_checkpoint.return_value = (None, None)  # what DeepSpeed returns where it finds no checkpoint
    return engine


# -- constructor ------------------------------------------------------------------------------------------------


@BOTH
def test_a_missing_config_file(lightnings: type, ours: type) -> None:
    assert_raises_as_lightning(lambda: lightnings(config="no_such.json"), lambda: ours(config="no_such.json"))


@pytest.mark.parametrize(
    ("lightnings", "ours"),
    [(LightningDeepSpeedPrecision, DeepSpeedPrecision), (LightningFabricDeepSpeedPrecision, DeepSpeedFabricPrecision)],
    ids=["trainer", "fabric"],
)
def test_a_precision_deepspeed_does_not_train_in(lightnings: type, ours: type) -> None:
    assert_raises_as_lightning(lambda: lightnings("64-true"), lambda: ours("64-true"))


# -- start-up ---------------------------------------------------------------------------------------------------


@BOTH
def test_an_accelerator_other_than_cuda(lightnings: type, ours: type) -> None:
    """Ours also runs on CPU (an intended difference); any other accelerator is refused as by Lightning."""
    accelerator = MPSAccelerator if lightnings is LightningDeepSpeedStrategy else FabricMPSAccelerator
    devices = [torch.device("mps", 0)]
    assert_raises_as_lightning(
        lambda: lightnings(accelerator=accelerator(), parallel_devices=devices).setup_environment(),
        lambda: ours(accelerator=accelerator(), parallel_devices=devices).setup_environment(),
    )


@BOTH
@pytest.mark.parametrize("indices", [[1, 0], [0, 2], [1]])
def test_gpus_other_than_the_local_ranks(lightnings: type, ours: type, indices: list[int]) -> None:
    devices = [torch.device("cuda", index) for index in indices]
    accelerator = CUDAAccelerator if lightnings is LightningDeepSpeedStrategy else FabricCUDAAccelerator
    lightning = lightnings(accelerator=Mock(spec=accelerator), parallel_devices=devices)
    strategy = ours(parallel_devices=devices)
    setup = strategy.setup_distributed if ours is DeepSpeedStrategy else strategy._setup_distributed
    assert_raises_as_lightning(lightning.setup_environment, setup)


# -- models, optimizers, clipping -------------------------------------------------------------------------------


def test_eager_initialization_under_zero_3_in_the_trainer() -> None:
    def enter(strategy: Any) -> None:
        with strategy.tensor_init_context(empty_init=False):
            pass

    assert_raises_as_lightning(
        lambda: enter(LightningDeepSpeedStrategy(stage=3)), lambda: enter(DeepSpeedStrategy(stage=3))
    )


def test_eager_initialization_under_zero_3_in_fabric() -> None:
    assert_raises_as_lightning(
        lambda: LightningFabricDeepSpeedStrategy(stage=3).module_init_context(empty_init=False),
        lambda: DeepSpeedFabricStrategy(stage=3).module_init_context(empty_init=False),
    )


class _TwoOptimizers(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)

    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters())]


def test_several_optimizers_from_configure_optimizers() -> None:
    def with_module(strategy: Any) -> Any:
        module = _TwoOptimizers()
        module.trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
        strategy._lightning_module = module
        return strategy

    assert_raises_as_lightning(
        lambda: with_module(LightningDeepSpeedStrategy())._init_optimizers(),
        lambda: (strategy := with_module(DeepSpeedStrategy()))._initialize_for_training(strategy.lightning_module),
    )


def test_several_optimizers_set_up_with_one_model_in_fabric() -> None:
    model = nn.Linear(2, 2)
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.Adam(model.parameters())]
    assert_raises_as_lightning(
        lambda: LightningFabricDeepSpeedStrategy().setup_module_and_optimizers(model, optimizers),
        lambda: DeepSpeedFabricStrategy().setup_module_and_optimizers(model, optimizers),
    )


def test_setting_up_an_optimizer_alone_in_fabric() -> None:
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    assert_raises_as_lightning(
        lambda: LightningFabricDeepSpeedStrategy().setup_optimizer(optimizer),
        lambda: DeepSpeedFabricStrategy().setup_optimizer(optimizer),
    )


def test_clipping_by_value_in_the_trainer() -> None:
    lightning = LightningDeepSpeedStrategy()
    lightning._lightning_module = Mock()
    lightning._lightning_module.trainer.gradient_clip_algorithm = GradClipAlgorithmType.VALUE
    assert_raises_as_lightning(
        lightning.init_deepspeed, lambda: DeepSpeedStrategy()._complete_config("32-true", 1, 1, 0.5, "value")
    )


@pytest.mark.parametrize("method", ["clip_gradients_norm", "clip_gradients_value"])
def test_clipping_by_the_strategy_in_fabric(method: str) -> None:
    arguments = (Mock(), Mock(), 1.0)
    assert_raises_as_lightning(
        lambda: getattr(LightningFabricDeepSpeedStrategy(), method)(*arguments),
        lambda: getattr(DeepSpeedFabricStrategy(), method)(*arguments),
    )


def test_gradient_accumulation_steps_in_the_config_and_the_trainer() -> None:
    """Lightning refuses the key whatever its value; ours reads it while the Trainer keeps accumulate_grad_batches=1
    (docs/lightning-compatibility.md), and refuses it in Lightning's words where the two disagree."""
    config = {"gradient_accumulation_steps": 2}
    lightning = LightningDeepSpeedStrategy(config=config)
    lightning._lightning_module = Mock()
    assert_raises_as_lightning(
        lightning._format_batch_size_and_grad_accum_config,
        lambda: DeepSpeedStrategy(config=config)._complete_config("32-true", 4, 1),
    )


class _Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)


def _optimizer_step(plugin: Any, optimizer: Any, closure_result: Any) -> None:
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    model = _Model()
    model.trainer = trainer
    trainer.strategy._lightning_module = model
    plugin.optimizer_step(optimizer, model, lambda: closure_result)


def test_lbfgs() -> None:
    optimizer = torch.optim.LBFGS(nn.Linear(2, 2).parameters())
    assert_raises_as_lightning(
        lambda: _optimizer_step(LightningDeepSpeedPrecision("32-true"), optimizer, torch.tensor(1.0)),
        lambda: _optimizer_step(DeepSpeedPrecision("32-true"), optimizer, torch.tensor(1.0)),
    )


def test_training_step_returning_none() -> None:
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    assert_raises_as_lightning(
        lambda: _optimizer_step(LightningDeepSpeedPrecision("32-true"), optimizer, None),
        lambda: _optimizer_step(DeepSpeedPrecision("32-true"), optimizer, None),
    )


# -- checkpoints ------------------------------------------------------------------------------------------------


def test_storage_options_when_the_trainer_saves(tmp_path: Path) -> None:
    assert_raises_as_lightning(
        lambda: LightningDeepSpeedStrategy().save_checkpoint({}, tmp_path / "ckpt", storage_options={}),
        lambda: DeepSpeedStrategy().save_checkpoint({}, tmp_path / "ckpt", storage_options={}),
    )


@pytest.mark.parametrize("argument", ["storage_options", "filter"])
def test_storage_options_or_a_filter_when_fabric_saves(tmp_path: Path, argument: str) -> None:
    assert_raises_as_lightning(
        lambda: LightningFabricDeepSpeedStrategy().save_checkpoint(tmp_path / "ckpt", {}, **{argument: {}}),
        lambda: DeepSpeedFabricStrategy().save_checkpoint(tmp_path / "ckpt", {}, **{argument: {}}),
    )


@pytest.mark.parametrize("engines", [0, 2])
@pytest.mark.parametrize("method", ["save_checkpoint", "load_checkpoint"])
def test_other_than_one_engine_in_the_state(tmp_path: Path, method: str, engines: int) -> None:
    # Where they load, both check the path first: a checkpoint folder (one of no engine's) passes.
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "latest").write_text("checkpoint")
    torch.save({"dp_world_size": 1}, tmp_path / "checkpoint" / "mp_rank_00_model_states.pt")
    state: dict[str, Any] = {f"model{index}": _engine() for index in range(engines)} or {"model": nn.Linear(2, 2)}
    assert_raises_as_lightning(
        lambda: getattr(LightningFabricDeepSpeedStrategy(), method)(tmp_path, state=state),
        lambda: getattr(DeepSpeedFabricStrategy(), method)(tmp_path, state=state),
    )


@pytest.mark.parametrize("state", [None, {}])
def test_fabric_load_without_the_objects_to_restore(tmp_path: Path, state: Any) -> None:
    assert_raises_as_lightning(
        lambda: LightningFabricDeepSpeedStrategy().load_checkpoint(tmp_path, state=state),
        lambda: DeepSpeedFabricStrategy().load_checkpoint(tmp_path, state=state),
    )


def _load(strategy: Any, path: Path) -> Any:
    """Load ``path`` as each entry point does: the Trainer's strategy with its module set up, Fabric's with a state."""
    if isinstance(strategy, LightningDeepSpeedStrategy):  # ours too: registered as a subclass of Lightning's
        strategy._lightning_module = Mock()
        strategy.model = _engine()
        return strategy.load_checkpoint(path)
    return strategy.load_checkpoint(path, state={"model": _engine()})


@BOTH
@pytest.mark.parametrize("where", ["empty folder", "missing", "empty tag folder", "file of another strategy"])
def test_a_path_holding_no_deepspeed_checkpoint(tmp_path: Path, lightnings: type, ours: type, where: str) -> None:
    """Lightning's guess that a folder named ``checkpoint`` is the tag folder, and its advice to load the parent,
    gives way to ours: ours loads a real tag folder (docs/lightning-compatibility.md), so only its first sentence
    is kept."""
    path = {
        "empty folder": tmp_path,
        "missing": tmp_path / "missing",
        "empty tag folder": tmp_path / "checkpoint",
        "file of another strategy": tmp_path / "ddp.ckpt",
    }[where]
    if where.startswith("empty"):
        path.mkdir(exist_ok=True)
    elif where.startswith("file"):
        torch.save({"state_dict": {}}, path)
        # Intended difference (docs/lightning-compatibility.md): ours reads another strategy's file. The Trainer's
        # loads its weights (not fitting; a fit resumes it with its Adam moments: test_cross_strategy_cpu.py);
        # Fabric's reads it by the state's keys, and a Trainer's file holds no "model" entry.
        with pytest.raises(FileNotFoundError, match="not a valid DeepSpeed checkpoint"):
            _load(lightnings(), path)
        if ours is DeepSpeedStrategy:
            assert _load(ours(), path) == {"state_dict": {}}
        else:
            with pytest.raises(CheckpointError, match=r"no 'model' entry \(it holds \['state_dict'\]\)"):
                _load(ours(), path)
        return
    assert_raises_as_lightning(lambda: _load(lightnings(), path), lambda: _load(ours(), path), sentences=1)


@BOTH
def test_a_checkpoint_deepspeed_cannot_load(tmp_path: Path, lightnings: type, ours: type) -> None:
    """A folder that looks like a DeepSpeed checkpoint, but holds no model states for DeepSpeed to load: Lightning
    learns it from the engine, ours before loading, and says which file is missing; Lightning's advice (which
    differs between its Trainer and Fabric strategies) gives way to that."""
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "latest").write_text("checkpoint")
    assert_raises_as_lightning(lambda: _load(lightnings(), tmp_path), lambda: _load(ours(), tmp_path), sentences=1)
