"""Crash-safe saves and clear load errors, with real processes killed mid-save."""

from __future__ import annotations

import random
import signal
import struct
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from lightning_strategies.checkpoints import (
    STAGING_FOLDER,
    check_file,
    load_file,
    publish,
    recover,
    remove,
    staged_save,
    staging_path,
)
from lightning_strategies.errors import CheckpointError

WRITER = Path(__file__).with_name("checkpoint_writer.py")
KILLS = 12


def versions_in(path: Path) -> set[float]:
    files = sorted(path.glob("*.pt")) if path.is_dir() else [path]
    return {load_file(file, weights_only=True)["weights"].unique().item() for file in files}


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_save_killed_at_any_moment_leaves_the_previous_checkpoint_whole(kind: str, tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    survived = 0
    rng = random.Random(0)
    for _ in range(KILLS):
        writer = subprocess.Popen([sys.executable, str(WRITER), str(target), kind], stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None
        writer.stdout.readline()  # one save is complete: from now on a checkpoint must always exist
        time.sleep(rng.uniform(0, 0.3))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        recover(target)  # what every save and load of our strategies does first
        versions = versions_in(target)
        assert len(versions) == 1, f"a mix of versions {versions}: a partial save was published"
        if kind == "folder":
            assert len(list(target.glob("*.pt"))) == 4
        # Lightning looks for "last" checkpoints among the folder's *.ckpt entries only.
        assert sorted(path.name for path in tmp_path.glob("*.ckpt")) == ["last.ckpt"]
        survived += 1
    assert survived == KILLS


def test_a_failed_save_publishes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "model.ckpt"
    torch.save({"weights": torch.ones(1)}, target)
    with pytest.raises(RuntimeError, match="disk full"), staged_save(target) as staged:
        torch.save({"weights": torch.zeros(1)}, staged)
        raise RuntimeError("disk full")
    assert load_file(target, weights_only=True)["weights"].item() == 1


def listing(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.mark.parametrize("kind", ["file", "folder"])
@pytest.mark.parametrize("where", ["beside a checkpoint", "in folders that do not exist yet"])
def test_a_failed_save_leaves_the_folder_as_it_was(kind: str, where: str, tmp_path: Path) -> None:
    target = tmp_path / "model.ckpt" if where == "beside a checkpoint" else tmp_path / "new" / "runs" / "model.ckpt"
    if where == "beside a checkpoint":
        torch.save({"weights": torch.ones(1)}, target)
    before = listing(tmp_path)
    with pytest.raises(RuntimeError, match="disk full"), staged_save(target) as staged:
        if kind == "folder":
            staged.mkdir()
            staged = staged / "shard-0.pt"
        torch.save({"weights": torch.zeros(1)}, staged)
        raise RuntimeError("disk full")
    assert listing(tmp_path) == before


def test_a_failed_save_keeps_a_staging_folder_that_holds_another_save(tmp_path: Path) -> None:
    other = staging_path(tmp_path / "other.ckpt")
    other.parent.mkdir()
    other.write_bytes(b"being written by another save")
    with pytest.raises(RuntimeError), staged_save(tmp_path / "model.ckpt") as staged:
        staged.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert listing(tmp_path) == [STAGING_FOLDER, f"{STAGING_FOLDER}/other.ckpt"]


def test_a_failed_save_raises_its_own_error_where_the_clean_up_cannot_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def still_being_written(path: object) -> None:  # another rank writing into the folder as it is removed
        raise OSError(39, "Directory not empty")

    monkeypatch.setattr("shutil.rmtree", still_being_written)
    with pytest.raises(RuntimeError, match="disk full"), staged_save(tmp_path / "model.ckpt") as staged:
        staged.mkdir()
        raise RuntimeError("disk full")


def test_a_published_save_leaves_no_staging_folder_behind(tmp_path: Path) -> None:
    with staged_save(tmp_path / "model.ckpt") as staged:
        torch.save({"weights": torch.ones(1)}, staged)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.ckpt"]


@pytest.mark.parametrize(("before", "after"), [("folder", "file"), ("file", "folder"), ("folder", "folder")])
def test_publish_replaces_any_kind_with_any_kind(before: str, after: str, tmp_path: Path) -> None:
    target = tmp_path / "model.ckpt"
    for kind, value in ((before, 1.0), (after, 2.0)):
        staged = staging_path(target)
        staged.parent.mkdir(exist_ok=True)
        if kind == "folder":
            staged.mkdir()
            torch.save({"weights": torch.tensor(value)}, staged / "shard.pt")
        else:
            torch.save({"weights": torch.tensor(value)}, staged)
        publish(staged, target)
    assert target.is_dir() == (after == "folder")
    assert versions_in(target) == {2.0}
    assert list((tmp_path / STAGING_FOLDER).iterdir()) == []


def test_recover_puts_back_a_checkpoint_left_aside_between_two_renames(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    previous = staging_path(target).with_name("last.ckpt.previous")
    previous.parent.mkdir()
    torch.save({"weights": torch.ones(1)}, previous)
    recover(target)
    assert versions_in(target) == {1.0}


def test_remove_leaves_no_partial_checkpoint_under_the_name(tmp_path: Path) -> None:
    target = tmp_path / "epoch=0.ckpt"
    target.mkdir()
    (target / "shard.pt").write_bytes(b"x")
    remove(target)
    assert not target.exists()


def test_a_truncated_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "model.ckpt"
    torch.save({"weights": torch.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(CheckpointError, match=r"truncated or corrupted.*Resume from an earlier checkpoint"):
        check_file(path)


def flip_bytes(path: Path, record: str, count: int = 1) -> None:
    """Change ``count`` bytes in the middle of the zip record of ``path`` whose name ends with ``record``."""
    with zipfile.ZipFile(path) as archive:
        info = next(info for info in archive.infolist() if info.filename.endswith(record))
    data = bytearray(path.read_bytes())
    # The record's bytes follow its local header: 30 bytes, its name, and an extra field of the length stored there.
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_length + extra_length + info.file_size // 2
    for index in range(start, start + count):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("record", ["data.pkl", "data/0"])
def test_a_changed_byte_anywhere_is_refused_as_damage_not_as_weights_only(record: str, tmp_path: Path) -> None:
    path = tmp_path / "model.ckpt"
    torch.save({"weights": torch.ones(1000), "step": 3}, path)
    flip_bytes(path, record)
    with pytest.raises(CheckpointError, match=rf"is damaged: its record \S*{record} does not match") as caught:
        load_file(path, weights_only=True)
    assert "weights_only" not in str(caught.value)
    assert "Resume from an earlier checkpoint" in str(caught.value)


def test_a_damaged_checkpoint_names_the_newest_other_one_beside_it(tmp_path: Path) -> None:
    import os

    for step, name in enumerate(["epoch=0-step=10.ckpt", "epoch=0-step=20.ckpt", "last.ckpt"]):
        torch.save({"weights": torch.ones(1000), "step": step}, tmp_path / name)
        os.utime(tmp_path / name, (1000 + step, 1000 + step))
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    flip_bytes(tmp_path / "last.ckpt", "data/0")
    with pytest.raises(CheckpointError, match="damaged") as caught:
        load_file(tmp_path / "last.ckpt")
    assert f"ckpt_path={str(tmp_path / 'epoch=0-step=20.ckpt')!r}" in str(caught.value)


@pytest.mark.parametrize(
    ("content", "found"),
    [(b"", r"is empty \(0 bytes\)\."), (b"\x8f\x01random bytes", r"holds 14 bytes starting with b'\\x8f\\x01random'")],
)
def test_an_empty_or_foreign_file_is_described_as_found_not_guessed_at(
    content: bytes, found: str, tmp_path: Path
) -> None:
    path = tmp_path / "model.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=found + r".*Resume from an earlier checkpoint") as caught:
        check_file(path)
    assert "damaged after it was written" not in str(caught.value)


@pytest.mark.parametrize(("content", "message"), [(None, "No checkpoint file at"), (b"", "is empty")])
def test_a_missing_or_empty_file_is_refused(content: bytes | None, message: str, tmp_path: Path) -> None:
    path = tmp_path / "model.ckpt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        load_file(path)


class Custom:
    pass


def test_weights_only_refusal_says_how_to_allow_a_trusted_file(tmp_path: Path) -> None:
    path = tmp_path / "model.ckpt"
    torch.save({"object": Custom()}, path)
    with pytest.raises(CheckpointError, match=r"weights_only=True refuses.*add_safe_globals"):
        load_file(path, weights_only=True)
    assert isinstance(load_file(path, weights_only=False)["object"], Custom)


def test_a_remote_url_is_written_in_place(tmp_path: Path) -> None:
    # Object stores publish an object whole when it is closed: there is nothing to stage.
    with staged_save("s3://bucket/last.ckpt") as staged:
        assert staged == "s3://bucket/last.ckpt"
    with pytest.raises(ValueError, match="through its file system"):
        remove("s3://bucket/last.ckpt")


def test_the_legacy_torch_save_format_is_read(tmp_path: Path) -> None:
    # DeepSpeed writes it with checkpoint_serialization=False: no zip table of contents to check.
    path = tmp_path / "model_states.pt"
    torch.save({"step": 3}, path, _use_new_zipfile_serialization=False)
    check_file(path)
    assert load_file(path, weights_only=True, mmap=True) == {"step": 3}


def test_param_groups_of_another_adam_take_the_saved_values_of_the_keys_this_one_has():
    from lightning_strategies.checkpoints import adopted_param_groups

    weight = torch.nn.Parameter(torch.ones(2))
    groups = torch.optim.Adam([weight], lr=0.5).param_groups
    # A HybridAdam group: bias_correction is its own; foreach and fused torch's (ColossalAI's saved groups add them).
    saved = [
        {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.0, "bias_correction": True, "params": ["w"]}
    ]
    (adopted,) = adopted_param_groups(saved, groups)
    assert adopted["params"] == ["w"] and "bias_correction" not in adopted
    assert (adopted["lr"], adopted["betas"], adopted["eps"]) == (0.01, (0.8, 0.9), 1e-6)
    assert adopted["foreach"] is groups[0]["foreach"] and adopted["fused"] is groups[0]["fused"]
    with pytest.raises(CheckpointError, match=r"2 param group\(s\) and this run's 1: configure_optimizers"):
        adopted_param_groups(saved * 2, groups)
    # A parameter the saved run did not train would be left untrained by the loader.
    two = torch.optim.Adam([weight, torch.nn.Parameter(torch.ones(1))]).param_groups
    with pytest.raises(CheckpointError, match=r"trains \[1\] parameters by param group and this run's \[2\]"):
        adopted_param_groups(saved, two)
    assert adopted_param_groups(saved, two, check_sizes=False)[0]["params"] == ["w"]  # one process's share: unchecked


def test_saved_settings_the_resuming_optimizer_lacks_are_warned_of_where_they_change_training():
    from lightning_strategies.checkpoints import adopted_param_groups

    weight = torch.nn.Parameter(torch.ones(2))
    adamw = [{**group, "params": ["w"]} for group in torch.optim.AdamW([weight], lr=0.5).state_dict()["param_groups"]]
    # A HybridAdam group: no amsgrad, maximize, decoupled_weight_decay, foreach, fused (ColossalAI's CPUAdam keys).
    hybrid = [{"params": [weight], "lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
               "bias_correction": True}]  # fmt: skip
    with pytest.warns(UserWarning, match=r"built with decoupled_weight_decay=True, which this run's optimizer has no"):
        adopted_param_groups(adamw, hybrid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # HybridAdam(adamw_mode=True) decays as AdamW does; amsgrad=False and torch's foreach/fused change nothing.
        adopted_param_groups(adamw, hybrid, held_outside_groups={"decoupled_weight_decay": True})
        # HybridAdam's bias_correction=True is what torch's Adam always does.
        adopted_param_groups([{**hybrid[0], "params": ["w"]}], torch.optim.Adam([weight]).param_groups)
    with pytest.warns(UserWarning, match=r"amsgrad=True, decoupled_weight_decay=True"):
        amsgrad = [{**group, "amsgrad": True} for group in adamw]
        adopted_param_groups(amsgrad, hybrid)
    # Adam's L2 decay resumed by HybridAdam(adamw_mode=True), which decays decoupled: a change, said.
    adam = [
        {**group, "params": ["w"]}
        for group in torch.optim.Adam([weight], weight_decay=0.1).state_dict()["param_groups"]
    ]
    with pytest.warns(UserWarning, match=r"built with decoupled_weight_decay=False"):
        adopted_param_groups(adam, hybrid, held_outside_groups={"decoupled_weight_decay": True})
    # HybridAdam without bias correction resumed by torch's Adam, which always corrects.
    with pytest.warns(UserWarning, match=r"built with bias_correction=False"):
        adopted_param_groups(
            [{**hybrid[0], "bias_correction": False, "params": ["w"]}], torch.optim.Adam([weight]).param_groups
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Without weight decay, how it would be applied changes nothing.
        adopted_param_groups([{**group, "weight_decay": 0.0} for group in adamw], hybrid)


def test_positions_of_a_weight_decay_split_are_not_named_after_the_state_dict():
    from lightning_strategies.checkpoints import keyed_by_name

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    # torch numbers 0.weight, 1.weight, 0.bias, 1.bias: not the state_dict's order.
    optimizer = torch.optim.AdamW(
        [{"params": [model[0].weight, model[1].weight]}, {"params": [model[0].bias, model[1].bias], "weight_decay": 0}]
    )
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    weights = model.state_dict()
    assert keyed_by_name(optimizer.state_dict(), weights) is None
    in_order = torch.optim.AdamW(model.parameters())  # one group: the state_dict's order
    model(torch.ones(1, 3)).sum().backward()
    in_order.step()
    named = keyed_by_name(in_order.state_dict(), weights)
    assert named is not None and named["state"]["1.weight"]["exp_avg"].shape == (2, 2)


def test_optimizer_states_keyed_by_name_from_positions():
    from lightning_strategies.checkpoints import keyed_by_name

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    optimizer = torch.optim.Adam([{"params": [model[0].weight]}, {"params": [model[0].bias], "lr": 0.1}])
    model[0](torch.ones(1, 2)).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    named = keyed_by_name(state, ["0.weight", "0.bias"])
    assert named is not None
    assert [group["params"] for group in named["param_groups"]] == [["0.weight"], ["0.bias"]]
    assert [group["lr"] for group in named["param_groups"]] == [0.001, 0.1]
    assert named["state"]["0.bias"]["exp_avg"] is state["state"][1]["exp_avg"]
    assert keyed_by_name(named, ["anything"]) == named  # keyed by name already
    # Positions for two of the state_dict's seven entries (the others the norm's parameters and buffers): not whose.
    assert keyed_by_name(state, list(model.state_dict())) is None
