"""A checkpoint layout is recognised exactly where the package that writes it is installed (its
``checkpoint_formats`` hook), a single torch.save file always, and refusing one says who reads it and how
to convert it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lightning_strategies import CheckpointError, checkpoints, hookimpl
from lightning_strategies.checkpoints import FILE, CheckpointFormat, as_fabric_layout, as_trainer_layout, identify
from lightning_strategies.checkpoints.formats import installed_formats
from lightning_strategies.hooks import plugins_of
from lightning_strategies.registry import StrategyRegistry


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def is_acme_folder(path: Path) -> bool:
    return path.is_dir() and (path / "acme.index").is_file()


ACME = CheckpointFormat(
    "acme",
    "an Acme sharded folder (acme.index beside its shards)",
    'the acme strategy (strategy="acme", from acme-strategy)',
    "`acme-convert {path} full.ckpt` writes one file of full weights",
    is_acme_folder,
)


class AcmePlugin:
    @hookimpl
    def checkpoint_formats(self):
        return [ACME]


@pytest.fixture
def acme_folder(tmp_path: Path) -> Path:
    touch(tmp_path / "acme.ckpt" / "acme.index")
    touch(tmp_path / "acme.ckpt" / "shard-0")
    return tmp_path / "acme.ckpt"


def test_a_plugins_format_is_recognised_only_while_the_plugin_is_registered(
    registry: StrategyRegistry, add_plugin: Callable[..., None], acme_folder: Path
) -> None:
    assert identify(acme_folder) is None
    add_plugin(AcmePlugin(), name="acme")
    assert identify(acme_folder) is ACME
    assert installed_formats() == [ACME]
    plugins_of(registry).remove("acme")
    assert identify(acme_folder) is None and installed_formats() == []


def test_a_single_torch_save_file_is_cores_own_format(registry: StrategyRegistry, tmp_path: Path) -> None:
    torch.save({"state_dict": {}}, tmp_path / "full.ckpt")
    assert identify(tmp_path / "full.ckpt") is FILE


def test_plugin_formats_are_asked_before_the_single_file(
    registry: StrategyRegistry, add_plugin: Callable[..., None], tmp_path: Path
) -> None:
    # DeepSpeed's per-rank model-states files are torch.save files too: the package's layout must win.
    shard = tmp_path / "rank_0_states.pt"
    torch.save({"module": {}}, shard)
    per_rank = CheckpointFormat("per_rank", "one rank's states", "its strategy", "", lambda path: path == shard)

    class PerRankPlugin:
        @hookimpl
        def checkpoint_formats(self):
            return [per_rank]

    add_plugin(PerRankPlugin(), name="per-rank")
    assert identify(shard) is per_rank


def test_a_failing_hook_leaves_the_other_plugins_formats(
    registry: StrategyRegistry, add_plugin: Callable[..., None], acme_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenPlugin:
        @hookimpl
        def checkpoint_formats(self):
            raise RuntimeError("cannot describe")

    add_plugin(BrokenPlugin(), name="broken")
    add_plugin(AcmePlugin(), name="acme")
    assert identify(acme_folder) is ACME
    assert "plugin 'broken' (throwaway-dist): checkpoint_formats failed" in caplog.text


def test_unknown_paths_are_not_guessed(registry: StrategyRegistry, tmp_path: Path) -> None:
    assert identify(tmp_path / "missing") is None
    assert identify(tmp_path) is None  # an empty folder
    assert identify(touch(tmp_path / "notes.txt")) is None  # not a torch.save file


def test_the_error_names_the_format_its_reader_and_the_conversion(
    registry: StrategyRegistry, add_plugin: Callable[..., None], acme_folder: Path
) -> None:
    add_plugin(AcmePlugin(), name="acme")
    message = str(checkpoints.foreign_checkpoint_error(acme_folder, "FSDP2Strategy", "a DCP folder or one full file"))
    assert "is an Acme sharded folder (acme.index" in message
    assert "FSDP2Strategy reads a DCP folder or one full file" in message
    assert 'Resume it with the acme strategy (strategy="acme"' in message
    assert f"`acme-convert {acme_folder} full.ckpt`" in message


def test_an_unknown_layout_says_to_check_the_path_or_install_its_package(
    registry: StrategyRegistry, acme_folder: Path
) -> None:
    message = str(checkpoints.foreign_checkpoint_error(acme_folder, "DeepSpeedStrategy", "a DeepSpeed folder"))
    assert "no checkpoint layout that the installed strategy packages know" in message
    assert "Check the path" in message and "install that package" in message


def test_a_fabric_file_and_the_trainer_layout_convert_both_ways() -> None:
    weights, moments = {"weight": torch.ones(2)}, {"state": {}, "param_groups": []}
    fabric = {"model": weights, "optimizer": moments, "step": 3}
    trainer = as_trainer_layout(fabric, "model", "optimizer")
    assert trainer == {"state_dict": weights, "optimizer_states": [moments], "step": 3}
    assert as_fabric_layout(trainer, "model", ["optimizer"]) == fabric
    # An optimizer the file has no state for is left out, for the loader to refuse by name.
    assert as_fabric_layout(trainer, "net", ["first", "second"]) == {"net": weights, "first": moments, "step": 3}
    with pytest.raises(CheckpointError, match=r"no 'net' entry \(it holds \['model', 'optimizer', 'step'\]\)"):
        as_trainer_layout(fabric, "net", "optimizer")
