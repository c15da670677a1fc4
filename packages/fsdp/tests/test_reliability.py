"""Reliability: a save that fails half way publishes nothing, damaged and foreign checkpoints are refused
with what to do before DCP or torch.load reads them, and Lightning's checkpoints load with weights_only=True.

The damage cases load real checkpoints of 2 processes (the reference run) into a plain model in this
process: validation comes before any model or process group is touched. The DeepSpeed and ColossalAI
folders are their layouts only (neither backend is installed with this package); the packages that write
them describe them to core's ``identify`` (their ``checkpoint_formats`` hook), stood in for here.
"""

from __future__ import annotations

import pickle
import shutil
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import read, run_group

sys.path.insert(0, str(Path(__file__).parent / "scripts"))

from lightning_strategies import hookimpl
from lightning_strategies import registry as registry_module
from lightning_strategies.checkpoints import CheckpointFormat, load_file
from lightning_strategies.errors import CheckpointError
from lightning_strategies.plugins import register_plugin
from lightning_strategies_fsdp.checkpoint import load_into, staged_checkpoint
from lightning_strategies_fsdp.convert import main as convert_main
from lightning_strategies_fsdp.validation import checked_sharded_metadata, load_sharded_state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

EARLIER = "Resume from an earlier checkpoint"


@pytest.fixture(scope="module")
def reliability_run(scenario_root: Path) -> Path:
    # The watchdog would end a rank once the other reports the refused checkpoint; here both are caught.
    watchdog_off = {"LIGHTNING_STRATEGIES_FAILED_RANK_TIMEOUT": "0"}
    return run_group("reliability", scenario_root / "reliability", env=watchdog_off)


@pytest.mark.parametrize(("kind", "error"), [("sharded", "CheckpointException"), ("full", "InjectedFailure")])
def test_save_failing_half_way_keeps_the_previous_checkpoint_as_last(
    reliability_run: Path, kind: str, error: str
) -> None:
    """Sharded: DCP wrote every shard and failed on its index. Full: rank 0 wrote half the file."""
    result = read(reliability_run, f"failed_save_{kind}")
    assert result["save_error"] == error
    assert result["visible"] == ["last.ckpt"]
    assert result["staged_left"] == []  # the partial write is gone, and the hidden staging folder with it
    # ckpt_path="last" found the checkpoint of step 2, whole, with its optimizer state.
    assert result["resumed_from"] == "last.ckpt"
    assert result["resumed_weights_equal_saved"]
    assert result["resumed_optimizer_steps"] == [2.0]


def test_trainer_refuses_damaged_and_foreign_checkpoints_on_every_rank(reliability_run: Path) -> None:
    result = read(reliability_run, "refusals")
    assert "__1_0.distcp is truncated: 100 bytes" in result["truncated_shard"]
    assert EARLIER in result["truncated_shard"]
    assert "is another package's checkpoint" in result["foreign_folder"]  # stood in for: see scenarios.py
    assert "another-package-convert" in result["foreign_folder"]
    assert "__1_0.distcp is damaged: its CRC-32" in result["zeroed_shard"]
    assert result["zeroed_shard_on_every_rank"]
    assert result["truncated_shard_on_every_rank"]
    assert result["foreign_folder_on_every_rank"]


def load(path: Path, weights_only: bool | None = None) -> dict:
    from scenarios import TinyTransformer

    return load_into(path, TinyTransformer(), "state_dict", {}, weights_only=weights_only)


def cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def zero_inside_a_record(folder: Path, shard: str) -> None:
    from scenarios import zero_inside_a_record

    zero_inside_a_record(folder, shard)


def overwrite_start(path: Path) -> None:
    path.write_bytes(b"\0" * 64 + path.read_bytes()[64:])


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated shard": (lambda folder: cut_in_half(folder / "__1_0.distcp"), r"__1_0.distcp is truncated: \d+ bytes"),
    "missing shard": (lambda folder: (folder / "__1_0.distcp").unlink(), "lacks __1_0.distcp, which its .metadata"),
    "corrupted shard": (lambda folder: overwrite_start(folder / "__0_0.distcp"), "__0_0.distcp is corrupted"),
    "zeroed bytes in a shard": (
        lambda folder: zero_inside_a_record(folder, "__0_0.distcp"),
        "__0_0.distcp is damaged: its CRC-32",
    ),
    "missing index": (lambda folder: (folder / ".metadata").unlink(), "has no .metadata"),
    "empty index": (lambda folder: (folder / ".metadata").write_bytes(b""), ".metadata, DCP's index .* is empty"),
    "truncated index": (lambda folder: cut_in_half(folder / ".metadata"), "cannot be read .*truncated"),
    "truncated meta.pt": (lambda folder: cut_in_half(folder / "meta.pt"), "meta.pt is truncated or corrupted"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_sharded_checkpoint_is_refused_with_the_fix(reference_run: Path, tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "damaged.ckpt"
    shutil.copytree(reference_run / "sharded_4", folder)
    harm, problem = DAMAGE[damage]
    harm(folder)
    with pytest.raises(CheckpointError, match=problem) as refused:
        load(folder)
    assert "earlier checkpoint" in str(refused.value)


def test_each_shards_checksum_computed_while_saving_is_that_of_the_file_on_disk(reference_run: Path) -> None:
    """The sums are taken from the bytes as they are written (the shard is not read back): they must describe the
    files exactly as they lie in the published folder, every rank's."""
    from lightning_strategies_fsdp.checksums import PIECE, piece_crc32s, saved_checksums

    folder = reference_run / "sharded_4"
    recorded = saved_checksums(folder)
    shards = sorted(path.name for path in folder.glob("*.distcp"))
    assert sorted(recorded) == shards == ["__0_0.distcp", "__1_0.distcp"]
    assert all(recorded[name] == {"piece_bytes": PIECE, "crc32": piece_crc32s(folder / name)} for name in shards)


def test_a_folder_saved_without_checksums_loads_unverified_and_says_so(reference_run: Path, tmp_path: Path) -> None:
    """A DCP folder from Lightning's FSDPStrategy or DCP itself has no checksum records: it loads, with one line."""
    folder = tmp_path / "unrecorded.ckpt"
    shutil.copytree(reference_run / "sharded_4", folder)
    for record in folder.glob(".checksums-*.json"):
        record.unlink()
    with pytest.warns(UserWarning, match="saved without checksums of its shards"):
        load(folder)


def test_a_shard_whose_checksum_record_is_lost_loads_unverified(reference_run: Path, tmp_path: Path) -> None:
    folder = tmp_path / "half-recorded.ckpt"
    shutil.copytree(reference_run / "sharded_4", folder)
    (folder / ".checksums-1.json").unlink()
    with pytest.warns(UserWarning, match=r"no recorded checksum for __1_0.distcp"):
        load(folder)


def test_damaged_full_checkpoint_file_is_refused_with_the_fix(reference_run: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.ckpt"
    shutil.copy(reference_run / "full_4.ckpt", truncated)
    cut_in_half(truncated)
    with pytest.raises(CheckpointError, match=r"truncated or corrupted.*Resume from an earlier checkpoint"):
        load(truncated)
    (tmp_path / "empty.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is empty"):
        load(tmp_path / "empty.ckpt")
    with pytest.raises(CheckpointError, match=r"No checkpoint at .*Check the path"):
        load(tmp_path / "nothing.ckpt")


def deepspeed_folder(path: Path) -> Path:
    (path / "checkpoint").mkdir(parents=True)
    (path / "latest").write_text("checkpoint")
    torch.save({"module": {}}, path / "checkpoint" / "mp_rank_00_model_states.pt")
    return path


class _ForeignWriters:
    """Stands in for the deepspeed and colossalai packages, which describe their layouts to core."""

    def __init__(self, deepspeed: Path, colossalai: Path) -> None:
        self.layouts = {"deepspeed": deepspeed, "colossalai": colossalai}

    @hookimpl
    def checkpoint_formats(self):
        return [
            CheckpointFormat(
                key,
                f"a {key} layout",
                f"the {key} strategies",
                f"`{key}-convert {{path}} full.ckpt`",
                lambda path, root=root: path == root or root in path.parents,
            )
            for key, root in self.layouts.items()
        ]


def test_foreign_checkpoints_are_named_with_the_way_to_use_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deepspeed = deepspeed_folder(tmp_path / "deepspeed.ckpt")
    colossalai = tmp_path / "colossalai.ckpt"
    (colossalai / "model").mkdir(parents=True)
    torch.save({"colossalai_sharded_checkpoint": True}, colossalai / "meta.pt")

    # Where the package that wrote a folder is missing, the folder is still refused before DCP reads it, as no
    # checkpoint of fsdp's (a ColossalAI folder's meta.pt looks like an incomplete one of fsdp's).
    monkeypatch.setattr(registry_module, "_registry", registry_module.StrategyRegistry())
    with pytest.raises(CheckpointError, match=r"is a folder but no checkpoint"):
        load(deepspeed)
    with pytest.raises(CheckpointError, match=r"has no \.metadata"):
        load(colossalai)

    register_plugin(registry_module.get_registry(), _ForeignWriters(deepspeed, colossalai), "writers")
    for path in (deepspeed, deepspeed / "checkpoint", deepspeed / "checkpoint" / "mp_rank_00_model_states.pt"):
        with pytest.raises(CheckpointError, match=r"is a deepspeed layout.*deepspeed strategies.*deepspeed-convert"):
            load(path)
    with pytest.raises(CheckpointError, match=r"is a colossalai layout.*the colossalai strategies"):
        load(colossalai)

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=r"is a folder but no checkpoint"):
        load(tmp_path / "notes")


def test_index_with_other_types_is_refused_unless_trusted(reference_run: Path, tmp_path: Path) -> None:
    """DCP unpickles .metadata without restriction; here only DCP's index types are built."""
    folder = tmp_path / "tampered.ckpt"
    shutil.copytree(reference_run / "sharded_4", folder)
    (folder / ".metadata").write_bytes(pickle.dumps(Fraction(1, 2)))
    with pytest.raises(CheckpointError, match=r"refers to fractions.Fraction.*weights_only=False"):
        load(folder)
    with pytest.raises(CheckpointError, match=r"holds a Fraction, not DCP's index"):
        load(folder, weights_only=False)  # unpickled as DCP would, then refused for what it is


def test_non_tensor_items_follow_weights_only(tmp_path: Path) -> None:
    """DCP unpickles non-tensor items with weights_only=False; here they follow the caller's weights_only."""
    dcp.save({"weights": torch.ones(2), "extra": Fraction(1, 3)}, checkpoint_id=tmp_path, no_dist=True)
    metadata = checked_sharded_metadata(tmp_path, weights_only=None)
    with pytest.raises(CheckpointError, match=r"extra holds objects that loading with weights_only=True refuses"):
        load_sharded_state({"extra": None}, tmp_path, metadata, weights_only=None, no_dist=True)
    trusted = {"extra": None}
    load_sharded_state(trusted, tmp_path, metadata, weights_only=False, no_dist=True)
    assert trusted["extra"] == Fraction(1, 3)


def test_a_different_model_is_told_apart_from_damage(tmp_path: Path) -> None:
    """DCP's own errors (here a shape mismatch) arrive as one CheckpointError, not every rank's tracebacks."""
    dcp.save({"weights": torch.ones(2)}, checkpoint_id=tmp_path, no_dist=True)
    metadata = checked_sharded_metadata(tmp_path, weights_only=None)
    with pytest.raises(CheckpointError, match=r"failed on rank 0: .*differs from the one saved, build the same"):
        load_sharded_state({"weights": torch.empty(3)}, tmp_path, metadata, weights_only=None, no_dist=True)


def test_lightning_checkpoints_load_with_weights_only(reference_run: Path) -> None:
    """Lightning 2.6's loop state, callbacks and plain hyperparameters pass torch's weights_only=True, so the
    strategies keep Lightning's weights_only (None: torch's default, True) for meta.pt and full files."""
    for path in (reference_run / "sharded_4" / "meta.pt", reference_run / "full_4.ckpt"):
        checkpoint = load_file(path, weights_only=True)
        assert {"loops", "callbacks", "hyper_parameters", "global_step"} <= set(checkpoint)
        assert checkpoint["hyper_parameters"]["lr"] == 0.01
    rest = load(reference_run / "sharded_4", weights_only=True)
    assert rest["global_step"] == 4


def test_default_weights_only_refuses_pickled_objects_in_meta_and_full_files(
    reference_run: Path, tmp_path: Path
) -> None:
    """Lightning's weights_only=None is torch's default (True), not bool(None) = False."""
    folder = tmp_path / "sharded.ckpt"
    shutil.copytree(reference_run / "sharded_4", folder)
    meta = torch.load(folder / "meta.pt", weights_only=True)
    torch.save({**meta, "hyper_parameters": {"ratio": Fraction(1, 3)}}, folder / "meta.pt")
    full = torch.load(reference_run / "full_4.ckpt", weights_only=True)
    torch.save({**full, "hyper_parameters": {"ratio": Fraction(1, 3)}}, tmp_path / "full.ckpt")
    for path in (folder, tmp_path / "full.ckpt"):
        with pytest.raises(CheckpointError, match=r"weights_only=True refuses.*add_safe_globals"):
            load(path)
        assert load(path, weights_only=False)["hyper_parameters"]["ratio"] == Fraction(1, 3)


def test_saving_over_a_folder_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "results.csv").write_text("keep me")
    with pytest.raises(IsADirectoryError, match=r"holds no checkpoint"), staged_checkpoint(tmp_path / "outputs"):
        pass
    assert (tmp_path / "outputs" / "results.csv").read_text() == "keep me"


def test_removing_a_checkpoint_leaves_nothing_under_its_name(reference_run: Path, tmp_path: Path) -> None:
    """What ModelCheckpoint(save_top_k=...) calls; rank 0 moves the folder out of the name, then deletes it."""
    from lightning_strategies_fsdp.strategy import FSDP2Strategy

    folder = tmp_path / "epoch=0-step=4.ckpt"
    shutil.copytree(reference_run / "sharded_4", folder)
    FSDP2Strategy().remove_checkpoint(folder)
    assert not folder.exists()
    assert not any(path.suffix == ".ckpt" for path in tmp_path.rglob("*"))


def test_conversion_refuses_a_damaged_checkpoint(
    reference_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "damaged.ckpt"
    shutil.copytree(reference_run / "sharded_4", folder)
    cut_in_half(folder / "__0_0.distcp")
    assert convert_main([str(folder), str(tmp_path / "out.ckpt")]) == 2
    assert "__0_0.distcp is truncated" in capsys.readouterr().err
    assert not (tmp_path / "out.ckpt").exists()


def test_the_conformance_reliability_tier_passes_on_two_processes(tmp_path: Path) -> None:
    # Real SIGKILLs inside and between saves, resumes compared with an uninterrupted run, and a
    # rank that raises or is killed in training_step (core's conformance kit, ~90 s on 2 cores).
    from lightning_strategies.conformance import run_check

    report = run_check("fsdp", accelerator="cpu", devices=2, workdir=tmp_path, tiers=("reliability",))
    assert report.passed, str(report)
