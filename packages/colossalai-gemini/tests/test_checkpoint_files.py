"""Crash-safe saves and checked loads, on CPU.

Gemini needs CUDA, so what runs here is the strategy's own checkpoint code around it: the staged full
save (the states Gemini would gather are a real Lightning checkpoint from a CPU Trainer), removal,
and every check made before a file or folder reaches Lightning's or ColossalAI's loader. Sharded
folders are written by ColossalAI's own index-format writer (GeneralCheckpointIO, which runs on
CPU); the staged sharded save itself runs in the GPU tier (test_gpu.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_strategies.checkpoints import STAGING_FOLDER, staging_path
from lightning_strategies.errors import CheckpointError
from lightning_strategies.testing import another_packages_checkpoint, written_by_another_package
from lightning_strategies_colossalai.sharded_checkpoint import SHARDED_MARKER, sharded_meta
from lightning_strategies_colossalai.strategy import ColossalAIStrategy


class Remembered:
    """A user object in a checkpoint: torch.load(weights_only=True) refuses to unpickle it."""


class SmallModel(BoringModel):
    def __init__(self, learning_rate: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()


@pytest.fixture(scope="module")
def lightning_checkpoint(tmp_path_factory) -> dict:
    """What Lightning hands to save_checkpoint after two training steps (loops, callbacks, hyperparameters)."""
    folder = tmp_path_factory.mktemp("cpu-run")
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=folder,
    )
    trainer.fit(SmallModel())
    trainer.save_checkpoint(folder / "run.ckpt")
    return torch.load(folder / "run.ckpt", weights_only=False)


def strategy() -> ColossalAIStrategy:
    return ColossalAIStrategy(placement_policy="cuda")


def other(checkpoint: dict) -> dict:
    changed = dict(checkpoint, global_step=checkpoint["global_step"] + 1)
    changed["state_dict"] = {key: value + 1 for key, value in checkpoint["state_dict"].items()}
    return changed


def write_half_and_fail(checkpoint, path, storage_options=None):
    """A full disk: part of the file is written, then the write fails."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    Path(path).write_bytes(Path(path).read_bytes()[:200])
    raise OSError(28, "No space left on device")


def visible(folder: Path) -> list[str]:
    return sorted(item.name for item in folder.iterdir() if not item.name.startswith("."))


# ------------------------------------------------------------------------------------ full files


def test_full_save_failing_half_way_keeps_the_previous_checkpoint(tmp_path, lightning_checkpoint, monkeypatch):
    colossalai = strategy()
    path = tmp_path / "last.ckpt"
    colossalai.save_checkpoint(lightning_checkpoint, path)
    previous = path.read_bytes()

    monkeypatch.setattr(colossalai.checkpoint_io, "save_checkpoint", write_half_and_fail)
    with pytest.raises(OSError, match="No space left"):
        colossalai.save_checkpoint(other(lightning_checkpoint), path)
    assert path.read_bytes() == previous
    assert visible(tmp_path) == ["last.ckpt"]
    assert not (tmp_path / STAGING_FOLDER).exists()  # the partial file is removed, with the folder it was staged in

    loaded = colossalai.load_checkpoint(path)  # torch's default weights_only (True on torch >= 2.6)
    assert loaded["global_step"] == lightning_checkpoint["global_step"]
    for key, value in lightning_checkpoint["state_dict"].items():
        assert torch.equal(loaded["state_dict"][key], value)

    monkeypatch.undo()
    colossalai.save_checkpoint(other(lightning_checkpoint), path)  # the next save replaces it whole
    assert colossalai.load_checkpoint(path, weights_only=True)["global_step"] == lightning_checkpoint["global_step"] + 1
    assert not (tmp_path / STAGING_FOLDER).exists()  # nothing left beside the checkpoints


def test_a_checkpoint_left_aside_by_a_killed_save_is_put_back_on_load(tmp_path, lightning_checkpoint):
    colossalai = strategy()
    path = tmp_path / "last.ckpt"
    aside = staging_path(path).with_name("last.ckpt.previous")  # where core keeps it between two renames
    aside.parent.mkdir()
    torch.save(lightning_checkpoint, aside)
    assert colossalai.load_checkpoint(path)["global_step"] == lightning_checkpoint["global_step"]
    assert path.is_file() and not aside.exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", r"No checkpoint file at .*Check the path"),
        ("empty", r"is empty \(0 bytes\)\..*Resume from an earlier checkpoint"),
        ("truncated", r"truncated or corrupted.*Resume from an earlier checkpoint"),
    ],
)
def test_damaged_full_file_is_refused_with_the_fix(tmp_path, lightning_checkpoint, damage, message):
    path = tmp_path / "run.ckpt"
    if damage != "missing":
        torch.save(lightning_checkpoint, path)
        path.write_bytes(b"" if damage == "empty" else path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=message):
        strategy().load_checkpoint(path)


def test_a_file_that_is_no_lightning_checkpoint_is_named(tmp_path, lightning_checkpoint):
    path = tmp_path / "weights.pt"
    torch.save(lightning_checkpoint["state_dict"], path)  # a bare state dict
    with pytest.raises(CheckpointError, match=r"not a Lightning checkpoint.*model.load_state_dict"):
        strategy().load_checkpoint(path)


def test_remove_deletes_files_and_folders_whole(tmp_path, lightning_checkpoint):
    colossalai = strategy()
    file, folder = tmp_path / "epoch=0.ckpt", tmp_path / "epoch=1.ckpt"
    colossalai.save_checkpoint(lightning_checkpoint, file)
    (folder / "model").mkdir(parents=True)
    (folder / "meta.pt").write_bytes(b"meta")
    colossalai.remove_checkpoint(file)
    colossalai.remove_checkpoint(folder)
    assert visible(tmp_path) == []


def test_remote_full_checkpoint_goes_through_the_checkpoint_io_unstaged(lightning_checkpoint):
    import fsspec

    colossalai = strategy()
    url = "memory://checkpoints/run.ckpt"  # fsspec's in-memory file system stands in for s3:// or gs://
    colossalai.save_checkpoint(lightning_checkpoint, url)
    assert colossalai.load_checkpoint(url)["global_step"] == lightning_checkpoint["global_step"]
    colossalai.remove_checkpoint(url)
    assert not fsspec.filesystem("memory").exists(url)


# ------------------------------------------------------------------------------ other strategies


def test_another_packages_folder_is_named_with_its_conversion(tmp_path):
    with (
        another_packages_checkpoint(tmp_path) as path,
        pytest.raises(CheckpointError, match=r"is another package's.*-convert"),
    ):
        strategy().load_checkpoint(path)


def test_a_folder_of_no_known_layout_is_not_taken_for_a_sharded_checkpoint(tmp_path):
    (tmp_path / "other.ckpt").mkdir()
    with pytest.raises(
        CheckpointError, match=r"not a ColossalAIStrategy sharded checkpoint.*state_dict_type='sharded'"
    ):
        strategy().load_checkpoint(tmp_path / "other.ckpt")


def test_a_file_of_another_packages_layout_is_named(tmp_path):
    # DeepSpeed's per-rank model-states files are torch.save files: the layout its package describes decides.
    folder = tmp_path / "other.ckpt"
    folder.mkdir()
    torch.save({"module": {"weight": torch.zeros(2)}}, folder / "rank_0_states.pt")
    with (
        written_by_another_package(folder),
        pytest.raises(
            CheckpointError, match=r"another package's checkpoint.*ColossalAIStrategy reads one checkpoint file"
        ),
    ):
        strategy().load_checkpoint(folder / "rank_0_states.pt")


# ------------------------------------------------------------------------------ sharded folders


@pytest.fixture
def sharded_folder(tmp_path, lightning_checkpoint) -> Path:
    """Shards in ColossalAI's index format from its own writer; meta.pt as the strategy writes it."""
    from colossalai.checkpoint_io import GeneralCheckpointIO

    model = SmallModel()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 32)).sum().backward()
    optimizer.step()
    folder = tmp_path / "sharded.ckpt"
    writer = GeneralCheckpointIO()
    writer.save_model(model, str(folder / "model"), shard=True)
    writer.save_optimizer(optimizer, str(folder / "optimizer"), shard=True)
    torch.save(optimizer.state_dict(), tmp_path / "adam.pt")  # beside the folder: what its shards hold, by position
    checkpoint = dict(
        lightning_checkpoint, colossalai_loss_scaler={"scale": 1024.0, "growth_step": 3, "hysteresis_step": 2}
    )
    torch.save(sharded_meta(checkpoint, optimizer_count=1), folder / "meta.pt")
    return folder


@pytest.mark.parametrize("weights_only", [None, True])
def test_sharded_meta_file_loads_with_weights_only(sharded_folder, lightning_checkpoint, weights_only):
    meta = ColossalAIStrategy.check_sharded_checkpoint(sharded_folder, with_optimizer=True, weights_only=weights_only)
    assert meta[SHARDED_MARKER] is True and "state_dict" not in meta
    assert meta["global_step"] == lightning_checkpoint["global_step"]
    assert meta["hyper_parameters"] == {"learning_rate": 0.1}
    assert meta["optimizer_states"] == [{SHARDED_MARKER: "optimizer"}]
    assert meta["colossalai_loss_scaler"]["growth_step"] == 3
    # Valid up to the point where Gemini would read the shards into the set-up model.
    with pytest.raises(RuntimeError, match="only after the model is set up"):
        strategy().load_checkpoint(sharded_folder, weights_only=weights_only)


def test_sharded_meta_with_user_objects_says_how_to_load_it(sharded_folder):
    meta = torch.load(sharded_folder / "meta.pt", weights_only=True)
    torch.save(dict(meta, hyper_parameters={"tokenizer": Remembered()}), sharded_folder / "meta.pt")
    with pytest.raises(CheckpointError, match=r"weights_only=True refuses.*add_safe_globals"):
        ColossalAIStrategy.check_sharded_checkpoint(sharded_folder, with_optimizer=False, weights_only=True)
    meta = ColossalAIStrategy.check_sharded_checkpoint(sharded_folder, with_optimizer=False, weights_only=False)
    assert isinstance(meta["hyper_parameters"]["tokenizer"], Remembered)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-64])


def truncate_meta(folder: Path) -> None:
    truncate(folder / "meta.pt")


def drop_meta(folder: Path) -> None:
    (folder / "meta.pt").unlink()


def drop_model(folder: Path) -> None:
    shutil.rmtree(folder / "model")


def drop_optimizer(folder: Path) -> None:
    shutil.rmtree(folder / "optimizer")


def model_shard(folder: Path) -> Path:
    index = json.loads(next((folder / "model").glob("*.index.json")).read_text())
    return folder / "model" / next(iter(index["weight_map"].values()))


def truncate_shard(folder: Path) -> None:
    truncate(model_shard(folder))


def drop_shard(folder: Path) -> None:
    model_shard(folder).unlink()


def damage_index(folder: Path) -> None:
    index = next((folder / "model").glob("*.index.json"))
    index.write_text(index.read_text()[:20])


def truncate_param_groups(folder: Path) -> None:
    truncate(folder / "optimizer" / "pytorch_optim_group.bin")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (truncate_meta, r"meta.pt is truncated or corrupted"),
        (drop_meta, r"has no meta.pt .*incomplete"),
        (drop_model, r"has no model/ folder .*incomplete"),
        (truncate_shard, r"pytorch_model-.*truncated or corrupted"),
        (drop_shard, r"No checkpoint file at .*pytorch_model-"),
        (damage_index, r"index file .* is damaged"),
        (truncate_param_groups, r"pytorch_optim_group.bin is truncated"),
        (drop_optimizer, r"no optimizer/ folder.*weights-only"),
    ],
)
def test_damaged_sharded_folder_is_refused_before_colossalai_reads_it(sharded_folder, damage, message):
    damage(sharded_folder)
    with pytest.raises(CheckpointError, match=message):
        ColossalAIStrategy.check_sharded_checkpoint(sharded_folder, with_optimizer=True, weights_only=None)


def test_weights_only_sharded_folder_loads_without_optimizer(sharded_folder):
    drop_optimizer(sharded_folder)
    meta = ColossalAIStrategy.check_sharded_checkpoint(sharded_folder, with_optimizer=False, weights_only=None)
    assert meta[SHARDED_MARKER]


def test_meta_file_of_another_writer_is_refused(sharded_folder):
    torch.save({"epoch": 0}, sharded_folder / "meta.pt")
    with pytest.raises(CheckpointError, match=r"not written by ColossalAIStrategy"):
        ColossalAIStrategy.check_sharded_checkpoint(sharded_folder, with_optimizer=False, weights_only=None)
