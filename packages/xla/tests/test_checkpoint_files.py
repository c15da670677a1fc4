"""Crash-safe saves and checked loads on PJRT's CPU device, through the Trainer and Fabric.

The failing write is XLACheckpointIO's own ``torch.save``, made to stop half way (a full disk). XLA FSDP
needs several devices, which PJRT CPU cannot run here (README, "What only a TPU shows"): its checks run
on shard folders written here, and its staged save in the tpu tier.
"""

from __future__ import annotations

import re
from pathlib import Path

import conftest
import pytest
import torch
from lightning.fabric import Fabric
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_strategies.checkpoints import STAGING_FOLDER
from lightning_strategies.errors import CheckpointError
from lightning_strategies.testing import another_packages_checkpoint, written_by_another_package
from lightning_strategies_xla import SingleDeviceXLAStrategy, XLAAccelerator
from lightning_strategies_xla.xla_fsdp_checkpoint import check_xla_fsdp_checkpoint

DISK_FULL = "No space left on device"


def small_trainer(tmp_path, **overrides):
    # No validation, and no checkpoints unless a test asks for them.
    return conftest.small_trainer(tmp_path, **{"limit_val_batches": 0, "enable_checkpointing": False, **overrides})


@pytest.fixture
def disk_full_half_way(monkeypatch):
    """Make XLACheckpointIO's torch.save write half of the file, then fail."""
    write = torch.save

    def write_half(obj, path, *args, **kwargs):
        write(obj, path, *args, **kwargs)
        Path(path).write_bytes(Path(path).read_bytes()[: Path(path).stat().st_size // 2])
        raise OSError(28, DISK_FULL)

    return lambda: monkeypatch.setattr(torch, "save", write_half)


def visible(folder: Path) -> list[str]:
    return sorted(item.name for item in folder.iterdir() if not item.name.startswith("."))


def test_trainer_save_failing_half_way_keeps_the_previous_checkpoint_to_resume_from(tmp_path, disk_full_half_way):
    model = BoringModel()
    trainer = small_trainer(tmp_path)
    trainer.fit(model)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    previous = path.read_bytes()

    disk_full_half_way()
    with torch.no_grad():
        model.layer.weight.add_(1.0)  # the failed save would have held other weights
    with pytest.raises(OSError, match=DISK_FULL):
        trainer.save_checkpoint(path)
    assert path.read_bytes() == previous
    assert visible(tmp_path) == ["last.ckpt"]  # the half-written file is removed, never published

    resumed = small_trainer(tmp_path, max_epochs=2)
    resumed.fit(BoringModel(), ckpt_path=path)  # torch's default weights_only (True on torch >= 2.6)
    assert resumed.global_step == 8  # continued from the 4 steps of the kept checkpoint


def test_trainer_checkpoint_loads_with_weights_only_and_removals_leave_nothing_behind(tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_top_k=1)
    trainer = small_trainer(tmp_path, max_epochs=2, enable_checkpointing=True, callbacks=[checkpoints])
    trainer.fit(BoringModel())
    # Epoch 0's checkpoint was removed when epoch 1's was published.
    assert visible(tmp_path / "checkpoints") == ["epoch=1-step=8.ckpt"]
    assert list((tmp_path / "checkpoints" / STAGING_FOLDER).glob("*")) == []  # nothing half-written or aside

    restored = BoringModel()
    small_trainer(tmp_path).validate(restored, ckpt_path=checkpoints.best_model_path, weights_only=True)
    saved = torch.load(checkpoints.best_model_path, weights_only=True)["state_dict"]
    assert all(torch.equal(tensor.cpu(), saved[name]) for name, tensor in restored.state_dict().items())


def test_truncated_checkpoint_stops_the_trainer_with_the_fix(tmp_path):
    path = tmp_path / "run.ckpt"
    trainer = small_trainer(tmp_path, max_steps=1)
    trainer.fit(BoringModel())
    trainer.save_checkpoint(path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"truncated or corrupted.*Resume from an earlier checkpoint"):
        small_trainer(tmp_path).validate(BoringModel(), ckpt_path=path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", r"No checkpoint file at .*Check the path"),
        ("empty", r"is empty \(0 bytes\)\..*Resume from an earlier checkpoint"),
        ("state dict", r"not a Lightning checkpoint.*model.load_state_dict"),
    ],
)
def test_damaged_or_foreign_file_is_refused(tmp_path, damage, message):
    path = tmp_path / "run.ckpt"
    if damage == "empty":
        path.touch()
    elif damage == "state dict":
        torch.save(BoringModel().state_dict(), path)
    with pytest.raises(CheckpointError, match=message):
        SingleDeviceXLAStrategy().load_checkpoint(path)


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda path: shard_folder(path, world_size=2), r"sharded XLA FSDP checkpoint.*consolidate_sharded_ckpts"),
        (Path.mkdir, r"no checkpoint layout that the installed strategy packages know"),
    ],
)
def test_another_strategys_folder_is_named_with_its_conversion(tmp_path, write, message):
    path = tmp_path / "other.ckpt"
    write(path)
    with pytest.raises(CheckpointError, match=message):
        SingleDeviceXLAStrategy().load_checkpoint(path)


def test_another_packages_checkpoint_is_named_with_its_conversion(tmp_path):
    with (
        another_packages_checkpoint(tmp_path) as path,
        pytest.raises(CheckpointError, match=r"is another package's.*-convert"),
    ):
        SingleDeviceXLAStrategy().load_checkpoint(path)


def test_fabric_save_failing_half_way_keeps_the_previous_checkpoint(tmp_path, disk_full_half_way):
    fabric = Fabric(accelerator=XLAAccelerator(), devices=1, strategy="single_xla")
    model = fabric.setup_module(torch.nn.Linear(4, 4))
    path = tmp_path / "fabric.ckpt"
    fabric.save(path, {"model": model, "step": 1})
    disk_full_half_way()
    with pytest.raises(OSError, match=DISK_FULL):
        fabric.save(path, {"model": model, "step": 2})
    assert visible(tmp_path) == ["fabric.ckpt"]

    state = {"model": model, "step": 0}
    fabric.load(path, state, weights_only=True)
    assert state["step"] == 1

    path.write_bytes(path.read_bytes()[:-64])
    with pytest.raises(CheckpointError, match=r"fabric.ckpt is truncated or corrupted"):
        fabric.load(path, state)


# ----------------------------------------------------------------------------------------- XLA FSDP


def shard_folder(path: Path, world_size: int, ranks: list[int] | None = None) -> Path:
    path.mkdir()
    for rank in ranks if ranks is not None else range(world_size):
        torch.save({"model": {}}, path / f"checkpoint_rank-{rank:08d}-of-{world_size:08d}.pth")
    return path


def test_xla_fsdp_shards_of_another_world_size_say_how_to_load_them(tmp_path):
    folder = shard_folder(tmp_path / "sharded.ckpt", world_size=8)
    check_xla_fsdp_checkpoint(folder, "sharded", world_size=8)
    with pytest.raises(CheckpointError, match=r"saved by 8 processes and this run has 4.*consolidate_sharded_ckpts"):
        check_xla_fsdp_checkpoint(folder, "sharded", world_size=4)


def test_xla_fsdp_strategy_checks_before_lightning_reads_the_shards(tmp_path):
    from lightning_strategies_xla.fabric import XLAFSDPStrategy

    folder = shard_folder(tmp_path / "sharded.ckpt", world_size=8)
    strategy = XLAFSDPStrategy(state_dict_type="sharded")  # not launched: a world of one process
    with pytest.raises(CheckpointError, match=r"saved by 8 processes and this run has 1"):
        strategy.load_checkpoint(folder, state={"model": torch.nn.Linear(2, 2)})


@pytest.mark.parametrize(
    ("damage", "state_dict_type", "message"),
    [
        ("rank missing", "sharded", r"lacks the shards of ranks \[1\] \(of 4\).*incomplete"),
        ("shard truncated", "sharded", r"checkpoint_rank-00000002-of-00000004.pth is truncated"),
        ("full file", "sharded", r"is one file.*state_dict_type='full'"),
        ("shards", "full", r"is a sharded XLA FSDP checkpoint.*consolidate_sharded_ckpts"),
        (
            "another package",
            "sharded",
            r"another package's checkpoint.*XLAFSDPStrategy reads folders of checkpoint_rank",
        ),
        ("missing", "sharded", r"No checkpoint at"),
        ("missing", "full", r"No checkpoint file at"),
    ],
)
def test_xla_fsdp_checkpoint_problems_are_named(tmp_path, damage, state_dict_type, message):
    path = tmp_path / "xla_fsdp.ckpt"
    if damage == "rank missing":
        shard_folder(path, world_size=4, ranks=[0, 2, 3])
    elif damage == "shard truncated":
        shard = shard_folder(path, world_size=4) / "checkpoint_rank-00000002-of-00000004.pth"
        shard.write_bytes(shard.read_bytes()[:-64])
    elif damage == "full file":
        torch.save({"model": {}}, path)
    elif damage == "shards":
        shard_folder(path, world_size=4)
    elif damage == "another package":
        path.mkdir()
        (path / "shard-0").write_bytes(b"x")
    with written_by_another_package(path), pytest.raises(CheckpointError, match=re.compile(message, re.DOTALL)):
        check_xla_fsdp_checkpoint(path, state_dict_type, world_size=4)


@pytest.mark.tpu
def test_xla_fsdp_save_failing_half_way_keeps_the_previous_shards(tmp_path):
    """On a TPU VM: every process writes its shard; a write failing on all of them publishes nothing,
    and a save over an existing checkpoint replaces it whole."""
    from lightning_strategies_xla.fabric import XLAFSDPStrategy

    fabric = Fabric(accelerator="tpu", devices="auto", strategy=XLAFSDPStrategy(state_dict_type="sharded"))
    fabric.launch(_save_fail_and_load, tmp_path / "sharded.ckpt")


def _write_half(checkpoint_io, checkpoint, path, storage_options=None):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(b"PK\x03\x04" + bytes(64))  # the start of a torch.save file, no more
    raise OSError(28, DISK_FULL)


def _save_fail_and_load(fabric: Fabric, path: Path) -> None:
    from unittest import mock

    from lightning.fabric.plugins.io.xla import XLACheckpointIO

    model = fabric.setup_module(torch.nn.Linear(64, 64))
    fabric.save(path, {"model": model, "step": 1})
    shards = {shard: shard.read_bytes() for shard in path.glob("checkpoint_rank-*.pth")}
    assert len(shards) == fabric.world_size
    saved = {name: tensor.cpu().clone() for name, tensor in model.state_dict().items()}
    with mock.patch.object(XLACheckpointIO, "save_checkpoint", _write_half), pytest.raises(OSError, match=DISK_FULL):
        fabric.save(path, {"model": model, "step": 2})
    fabric.barrier()
    assert {shard: shard.read_bytes() for shard in path.glob("checkpoint_rank-*.pth")} == shards

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    state = {"model": model, "step": 0}
    fabric.load(path, state)
    assert state["step"] == 1
    assert all(torch.equal(tensor.cpu(), saved[name]) for name, tensor in model.state_dict().items())

    fabric.save(path, {"model": model, "step": 3})  # over the existing folder: replaced whole
    state = {"model": model, "step": 0}
    fabric.load(path, state)
    assert state["step"] == 3
