"""Lightning's words first (issue 32): for each input Lightning's FSDP strategies refuse on CPU, ours raise the same
type (or a subclass) with a message that begins with Lightning's, then say what to do with ours.

Each test runs Lightning's class and ours on the same input and reads Lightning's text from the installed Lightning
(``assert_raises_as_lightning``), so a ``pytest.raises(..., match=...)`` written against Lightning passes on ours.
Where a model set up through the strategy is part of the input, Lightning's side gets an FSDP1 module and ours an
FSDP2 one (each strategy's own kind). Where ours refuses what Lightning accepts, or accepts what it refuses,
docs/lightning-compatibility.md says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest
import torch
from lightning.fabric.strategies import FSDPStrategy as LightningFabricFSDPStrategy
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import FSDPStrategy as LightningFSDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

from lightning_strategies.testing import assert_raises_as_lightning
from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy
from lightning_strategies_fsdp.strategy import FSDP2Strategy

TRAINER = (LightningFSDPStrategy, FSDP2Strategy)
FABRIC = (LightningFabricFSDPStrategy, FSDP2FabricStrategy)
BOTH = pytest.mark.parametrize(("lightnings", "ours"), [TRAINER, FABRIC], ids=["trainer", "fabric"])


def _set_up_model(strategy: Any) -> Any:
    """A model set up through ``strategy``: FSDP1-wrapped for Lightning's, sharded by FSDP2 for ours."""
    if isinstance(strategy, (FSDP2Strategy, FSDP2FabricStrategy)):
        return Mock(spec=FSDPModule)
    model = Mock(spec=FullyShardedDataParallel)
    model.modules.return_value = [model]  # Lightning looks for FSDP modules among the state's modules
    return model


def _save(strategy: Any, path: Path, state: dict[str, Any] | None = None, **options: Any) -> None:
    """Save as each entry point does: the Trainer's strategy a checkpoint dict, Fabric's a state of live objects."""
    if isinstance(strategy, LightningFSDPStrategy):  # ours too: registered as a subclass of Lightning's
        strategy.save_checkpoint({"state_dict": {}}, path, **options)
    else:
        strategy.save_checkpoint(path, {"model": _set_up_model(strategy)} if state is None else state, **options)


def _load(strategy: Any, path: Path) -> Any:
    """Load as each entry point does: the Trainer's strategy with its model set up, Fabric's with a state."""
    if isinstance(strategy, LightningFSDPStrategy):
        strategy.model = _set_up_model(strategy)
        strategy._lightning_module = Mock()
        return strategy.load_checkpoint(path)
    return strategy.load_checkpoint(path, state={"model": _set_up_model(strategy)})


# -- constructor ------------------------------------------------------------------------------------------------


@BOTH
@pytest.mark.parametrize("name", ["bad", "hybrid"])
def test_an_unknown_sharding_strategy(lightnings: type, ours: type, name: str) -> None:
    assert_raises_as_lightning(lambda: lightnings(sharding_strategy=name), lambda: ours(sharding_strategy=name))


@BOTH
def test_an_unknown_state_dict_type(lightnings: type, ours: type, tmp_path: Path) -> None:
    """Lightning refuses it when saving; ours when the strategy is built, in the same words."""
    assert_raises_as_lightning(
        lambda: _save(lightnings(state_dict_type="invalid"), tmp_path / "ckpt"),
        lambda: ours(state_dict_type="invalid"),
    )


# -- saving -----------------------------------------------------------------------------------------------------


@BOTH
def test_storage_options_for_a_sharded_checkpoint(lightnings: type, ours: type, tmp_path: Path) -> None:
    """Lightning refuses storage_options for every checkpoint; ours takes them for full ones, which its CheckpointIO
    writes (docs/lightning-compatibility.md)."""
    assert_raises_as_lightning(
        lambda: _save(lightnings(state_dict_type="sharded"), tmp_path / "ckpt", storage_options={}),
        lambda: _save(ours(state_dict_type="sharded"), tmp_path / "ckpt", storage_options={}),
    )


def test_a_filter_for_a_sharded_checkpoint(tmp_path: Path) -> None:
    assert_raises_as_lightning(
        lambda: _save(LightningFabricFSDPStrategy(state_dict_type="sharded"), tmp_path / "ckpt", filter={}),
        lambda: _save(FSDP2FabricStrategy(state_dict_type="sharded"), tmp_path / "ckpt", filter={}),
    )


@BOTH
def test_a_full_checkpoint_over_a_folder(lightnings: type, ours: type, tmp_path: Path) -> None:
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / "results.csv").write_text("keep me")
    assert_raises_as_lightning(
        lambda: _save(lightnings(state_dict_type="full"), folder), lambda: _save(ours(state_dict_type="full"), folder)
    )


@pytest.mark.parametrize("models", [0, 2])
@pytest.mark.parametrize("method", ["save_checkpoint", "load_checkpoint"])
def test_other_than_one_model_in_the_state(tmp_path: Path, method: str, models: int) -> None:
    def state(strategy: Any) -> dict[str, Any]:
        return {f"model{index}": _set_up_model(strategy) for index in range(models)} or {"model": nn.Linear(2, 2)}

    lightning, ours = LightningFabricFSDPStrategy(), FSDP2FabricStrategy()
    assert_raises_as_lightning(
        lambda: getattr(lightning, method)(tmp_path / "ckpt", state=state(lightning)),
        lambda: getattr(ours, method)(tmp_path / "ckpt", state=state(ours)),
    )


# -- loading ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [None, {}])
def test_fabric_load_without_the_objects_to_restore(tmp_path: Path, state: Any) -> None:
    assert_raises_as_lightning(
        lambda: LightningFabricFSDPStrategy().load_checkpoint(tmp_path, state=state),
        lambda: FSDP2FabricStrategy().load_checkpoint(tmp_path, state=state),
    )


def test_fabric_load_of_an_optimizer_alone(tmp_path: Path) -> None:
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    assert_raises_as_lightning(
        lambda: LightningFabricFSDPStrategy().load_checkpoint(tmp_path, state=optimizer),
        lambda: FSDP2FabricStrategy().load_checkpoint(tmp_path, state=optimizer),
    )


def test_fabric_load_raw_of_a_folder(tmp_path: Path) -> None:
    assert_raises_as_lightning(
        lambda: LightningFabricFSDPStrategy().load_checkpoint(tmp_path, state=nn.Linear(2, 2)),
        lambda: FSDP2FabricStrategy().load_checkpoint(tmp_path, state=nn.Linear(2, 2)),
    )


@BOTH
@pytest.mark.parametrize("where", ["empty folder", "missing", "folder of other files"])
def test_a_path_holding_no_checkpoint(lightnings: type, ours: type, tmp_path: Path, where: str) -> None:
    path = {"empty folder": tmp_path, "missing": tmp_path / "missing", "folder of other files": tmp_path / "out"}
    if where == "folder of other files":
        path[where].mkdir()
        (path[where] / "results.csv").write_text("not a checkpoint")
    assert_raises_as_lightning(lambda: _load(lightnings(), path[where]), lambda: _load(ours(), path[where]))


def test_resuming_another_number_of_optimizers(tmp_path: Path) -> None:
    path = tmp_path / "two-states.ckpt"
    torch.save({"state_dict": {}, "optimizer_states": [{"state": {}}, {"state": {}}]}, path)

    def resume(strategy: Any) -> Any:
        trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
        trainer.state.fn = TrainerFn.FITTING
        strategy._lightning_module = Mock(trainer=trainer)
        strategy.model = _set_up_model(strategy)
        strategy.optimizers = [torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)]
        return strategy.load_checkpoint(path)

    # Lightning loads the weights before it counts the optimizers: the FSDP1 calls stand in for a real model.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("lightning.pytorch.strategies.fsdp._load_raw_module_state", lambda *args, **kwargs: None)
        assert_raises_as_lightning(
            lambda: resume(LightningFSDPStrategy(state_dict_type="full")),
            lambda: resume(FSDP2Strategy(state_dict_type="full")),
        )


def test_skipping_the_gradient_sync_of_a_module_not_set_up() -> None:
    def skip(strategy: Any) -> None:
        with strategy._backward_sync_control.no_backward_sync(nn.Linear(2, 2), True):
            pass

    assert_raises_as_lightning(lambda: skip(LightningFabricFSDPStrategy()), lambda: skip(FSDP2FabricStrategy()))


def test_a_requested_key_the_checkpoint_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both load the model and return the checkpoint's other entries; a key of the state among neither is refused
    under strict loading. The model loads are stood in for (a real one: test_lightning_behaviours.py)."""
    path = tmp_path / "full.ckpt"
    torch.save({"model": {}}, path)
    monkeypatch.setattr("lightning.fabric.strategies.model_parallel._load_raw_module_state", lambda *_, **__: None)
    monkeypatch.setattr("lightning_strategies_fsdp.checkpoint.load_into", lambda *_, **__: {})

    def load(strategy: Any) -> Any:
        return strategy.load_checkpoint(path, state={"model": _set_up_model(strategy), "coconut": 11})

    assert_raises_as_lightning(lambda: load(LightningFabricFSDPStrategy()), lambda: load(FSDP2FabricStrategy()))
