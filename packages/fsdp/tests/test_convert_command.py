"""`lightning-strategies convert` from a DCP folder two processes saved: one complete file (weights, Adam states by
parameter name, loop state), the folder back from that file, and the layouts it is refused for with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_checkpoints import assert_close, load_weights, model_checkpoint_file

from lightning_strategies.cli import main as cli
from lightning_strategies_fsdp.checkpoint import sharded_to_full


def test_a_dcp_folder_becomes_one_complete_file(reference_run: Path, tmp_path: Path, capsys) -> None:
    source = model_checkpoint_file(reference_run)
    out = tmp_path / "full.ckpt"
    assert cli(["convert", str(source), str(out), "--to", "full"]) == 0
    printed = capsys.readouterr()
    assert f"reading {source}: a sharded torch.distributed.checkpoint folder" in printed.err
    assert "one file with the weights, optimizer states, schedulers and loop state" in printed.err
    assert "done:" in printed.err
    checkpoint = torch.load(out, weights_only=False)
    assert_close(checkpoint["state_dict"], load_weights(reference_run / "weights_4.pt"))
    assert checkpoint["global_step"] == 4
    (optimizer,) = checkpoint["optimizer_states"]
    assert set(optimizer["state"]) == set(checkpoint["state_dict"])
    assert all(float(state["step"]) == 4.0 for state in optimizer["state"].values())

    # What the fsdp package's own converter writes, entry for entry.
    expected = torch.load(sharded_to_full(source, tmp_path / "by_fsdp.ckpt"), weights_only=False)
    assert_close(optimizer["state"]["head.weight"], expected["optimizer_states"][0]["state"]["head.weight"])

    # And back: a DCP folder again, which reads back to the same file.
    folder = tmp_path / "sharded"
    assert cli(["convert", str(out), str(folder), "--to", "fsdp"]) == 0
    again = torch.load(sharded_to_full(folder, tmp_path / "again.ckpt"), weights_only=False)
    assert_close(again["state_dict"], checkpoint["state_dict"])
    assert_close(again["optimizer_states"][0]["state"]["head.weight"], optimizer["state"]["head.weight"])


def test_the_folder_is_fsdps_already(reference_run: Path, tmp_path: Path, capsys) -> None:
    assert cli(["convert", str(reference_run / "sharded_4"), str(tmp_path / "x"), "--to", "fsdp"]) == 0
    assert "nothing to convert" in capsys.readouterr().out
    assert not (tmp_path / "x").exists()


def test_deepspeeds_universal_layout_by_parameter_name(reference_run: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("lightning_strategies_deepspeed")
    source, out = reference_run / "sharded_4", tmp_path / "zero"
    assert cli(["convert", str(source), str(out), "--to", "deepspeed"]) == 0
    assert "resume it with the deepspeed strategies" in capsys.readouterr().out
    expected = torch.load(sharded_to_full(source, tmp_path / "full.ckpt"), weights_only=False)
    (optimizer,) = expected["optimizer_states"]
    for name, state in optimizer["state"].items():
        folder = out / "checkpoint_universal" / "zero" / name
        torch.testing.assert_close(torch.load(folder / "fp32.pt")["param"], expected["state_dict"][name].float())
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(torch.load(folder / f"{key}.pt")["param"], state[key])
        assert float(torch.load(folder / "step.pt")) == 4.0
    # The temporary full file it went through is gone; only what the test wrote is left beside the output.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["full.ckpt", "zero"]


def test_colossalai_gets_the_file_with_the_states_by_name(reference_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning_strategies_colossalai")
    source, out = reference_run / "sharded_4", tmp_path / "for_colossalai.ckpt"
    assert cli(["convert", str(source), str(out), "--to", "colossalai"]) == 0
    written = torch.load(out, weights_only=False)
    assert_close(written["state_dict"], load_weights(reference_run / "weights_4.pt"))
    (optimizer,) = written["optimizer_states"]  # by name, as FSDP2 keys them: the strategy numbers them on load
    assert set(optimizer["state"]) == set(written["state_dict"])


def converted_ddp_file(model: torch.nn.Module, folder: Path) -> torch.optim.Optimizer:
    """Save what ddp saves after one Adam step of ``model`` (optimizer states by position) as ``folder/ddp.ckpt``,
    convert it into the DCP folder ``folder/sharded``, and return the optimizer."""
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, model[0].in_features)).sum().backward()
    optimizer.step()
    saved = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "global_step": 1}
    torch.save(saved, folder / "ddp.ckpt")
    assert cli(["convert", str(folder / "ddp.ckpt"), str(folder / "sharded"), "--to", "fsdp"]) == 0
    return optimizer


@pytest.mark.parametrize("with_buffers", [False, True])
def test_a_file_saved_by_ddp_converts_with_its_adam_states(tmp_path: Path, with_buffers: bool) -> None:
    """torch keys a plain run's optimizer state by parameter position. Where every state_dict entry is a trained
    parameter, the DCP folder keys it by name, as the fsdp strategies save it (and resume it); with buffers beside
    them, which position is whose is not recorded, and the positions come back as ints (DCP keeps dict keys as
    strings, which torch's load_state_dict would match to no parameter, restoring no state, silently)."""
    layers = [torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)]
    model = torch.nn.Sequential(*layers, *([torch.nn.BatchNorm1d(2)] if with_buffers else []))
    optimizer = converted_ddp_file(model, tmp_path)
    back = torch.load(sharded_to_full(tmp_path / "sharded", tmp_path / "back.ckpt"), weights_only=True)
    (state,) = back["optimizer_states"]
    names = [name for name, _ in model.named_parameters()]
    assert list(state["state"]) == (list(range(len(names))) if with_buffers else names)
    restored = torch.optim.Adam(model.parameters())
    restored.load_state_dict(state)  # by the order of param_groups, names or positions alike
    for parameter in model.parameters():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(restored.state[parameter][key], optimizer.state[parameter][key])


def test_low_memory_reads_the_shards_into_mapped_scratch_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same file either way; chosen by itself where the folder is larger than half the memory available."""
    from lightning_strategies_fsdp import checkpoint as checkpoints

    converted_ddp_file(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 2)), tmp_path)

    mapped = []
    whole_tensor = checkpoints._whole_tensor
    monkeypatch.setattr(
        checkpoints, "_whole_tensor", lambda item, backing: mapped.append(backing) or whole_tensor(item, backing)
    )
    monkeypatch.setattr(checkpoints, "available_memory", lambda: 1024)  # less than twice the folder's size
    by_itself = torch.load(sharded_to_full(tmp_path / "sharded", tmp_path / "chosen.ckpt"), weights_only=True)
    assert mapped and all(backing is not None for backing in mapped)
    in_memory = torch.load(
        sharded_to_full(tmp_path / "sharded", tmp_path / "memory.ckpt", low_memory=False), weights_only=True
    )
    assert mapped[-1] is None
    assert_close(by_itself["state_dict"], in_memory["state_dict"])
    for name, state in in_memory["optimizer_states"][0]["state"].items():
        assert_close(by_itself["optimizer_states"][0]["state"][name], state)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chosen.ckpt", "ddp.ckpt", "memory.ckpt", "sharded"]
