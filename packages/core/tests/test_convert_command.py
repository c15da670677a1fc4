"""`lightning-strategies convert`: one full file of a real Trainer checkpoint into other layouts, what is refused
(an existing output, a damaged or foreign source, a layout no package writes exactly) and what each refusal says."""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_strategies.cli import main as cli


class Remembered:
    """A user object in the hyperparameters: torch.load(weights_only=True) refuses to unpickle it."""


class SmallModel(BoringModel):
    def __init__(self, note: object = None) -> None:
        super().__init__()
        self.save_hyperparameters()

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]


def trained_checkpoint(path: Path, note: object = None) -> Path:
    trainer = L.Trainer(
        accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=path.parent,
    )  # fmt: skip
    trainer.fit(SmallModel(note))
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_checkpoint(tmp_path_factory.mktemp("convert") / "full.ckpt")


def read(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def test_the_same_layout_is_left_as_it_is(registry, full: Path, tmp_path: Path, capsys) -> None:
    assert cli(["convert", str(full), str(tmp_path / "out.ckpt"), "--to", "full"]) == 0
    assert "nothing to convert" in capsys.readouterr().out
    assert not (tmp_path / "out.ckpt").exists()


def test_weights_alone_on_request(registry, full: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "weights.ckpt"
    assert cli(["convert", str(full), str(out), "--to", "full", "--drop-optimizer-states"]) == 0
    printed = capsys.readouterr()
    assert "but not the optimizer states" in printed.out
    assert "reading" in printed.err and "done:" in printed.err
    original, written = read(full), read(out)
    assert "optimizer_states" not in written
    assert written["global_step"] == original["global_step"] == 2
    assert written["lr_schedulers"] == original["lr_schedulers"]
    for name, tensor in original["state_dict"].items():
        assert torch.equal(written["state_dict"][name], tensor), name


def test_an_existing_output_is_never_written_over(registry, full: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "taken.ckpt"
    out.write_text("mine")
    assert cli(["convert", str(full), str(out), "--to", "full", "--drop-optimizer-states"]) == 2
    assert "exists already" in capsys.readouterr().err
    assert out.read_text() == "mine"


def test_a_damaged_or_foreign_source_is_refused(registry, full: Path, tmp_path: Path, capsys) -> None:
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(full.read_bytes()[:-200])
    assert cli(["convert", str(truncated), str(tmp_path / "a.ckpt"), "--to", "full", "--drop-optimizer-states"]) == 2
    assert "is truncated or corrupted" in capsys.readouterr().err
    assert not (tmp_path / "a.ckpt").exists()

    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "readme.txt").write_text("no checkpoint")
    assert cli(["convert", str(foreign), str(tmp_path / "b.ckpt"), "--to", "full"]) == 2
    assert "no checkpoint layout that the installed strategy packages know" in capsys.readouterr().err

    assert cli(["convert", str(tmp_path / "missing"), str(tmp_path / "c.ckpt"), "--to", "full"]) == 2
    assert "No checkpoint at" in capsys.readouterr().err


def test_pickled_objects_are_read_only_when_trusted(registry, tmp_path: Path, capsys) -> None:
    source = trained_checkpoint(tmp_path / "pickled.ckpt", note=Remembered())
    out = tmp_path / "out.ckpt"
    assert cli(["convert", str(source), str(out), "--to", "full", "--drop-optimizer-states"]) == 2
    assert "add --no-weights-only" in capsys.readouterr().err
    assert not out.exists()
    arguments = ["convert", str(source), str(out), "--to", "full", "--drop-optimizer-states", "--no-weights-only"]
    assert cli(arguments) == 0
    assert "optimizer_states" not in torch.load(out, weights_only=False)


def test_a_layout_whose_package_is_missing_names_the_install(registry, full: Path, tmp_path: Path, capsys) -> None:
    assert cli(["convert", str(full), str(tmp_path / "out"), "--to", "fsdp"]) == 2
    assert "pip install lightning-strategies-fsdp" in capsys.readouterr().err


def test_a_full_file_becomes_a_dcp_folder_and_back(installed_registry, full: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("lightning_strategies_fsdp")
    folder, back = tmp_path / "sharded", tmp_path / "back.ckpt"
    assert cli(["convert", str(full), str(folder), "--to", "fsdp"]) == 0
    assert (folder / ".metadata").is_file()
    assert cli(["convert", str(folder), str(back), "--to", "full"]) == 0
    assert "resume it with every strategy that loads full weights" in capsys.readouterr().out
    original, again = read(full), torch.load(back, weights_only=False)
    assert again["global_step"] == 2
    for name, tensor in original["state_dict"].items():
        assert torch.equal(again["state_dict"][name], tensor), name
    # torch keyed the optimizer states by position; the DCP folder keys them by parameter name, as the fsdp strategies
    # save them (every state_dict entry here is a trained parameter), and every moment comes back.
    (saved,), (returned,) = original["optimizer_states"], again["optimizer_states"]
    names = list(original["state_dict"])
    assert list(returned["state"]) == names and len(saved["state"]) == 2
    for position, state in saved["state"].items():
        for entry in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(returned["state"][names[position]][entry], state[entry]), (position, entry)
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".lightning-strategies-convert")]


def test_a_full_file_becomes_deepspeeds_universal_layout(installed_registry, full: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning_strategies_deepspeed")
    out = tmp_path / "zero"
    assert cli(["convert", str(full), str(out), "--to", "deepspeed"]) == 0
    assert (out / "latest_universal").read_text() == "checkpoint_universal"
    original = read(full)
    (saved,) = original["optimizer_states"]
    # torch numbers the parameters in the module's order, which here is the state_dict's.
    for index, name in enumerate(original["state_dict"]):
        folder = out / "checkpoint_universal" / "zero" / name
        assert torch.equal(torch.load(folder / "fp32.pt")["param"], original["state_dict"][name])
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.load(folder / f"{key}.pt")["param"], saved["state"][index][key])
        assert float(torch.load(folder / "step.pt")) == float(saved["state"][index]["step"])


def test_colossalai_reads_the_full_file_itself(installed_registry, full: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("lightning_strategies_colossalai")
    out = tmp_path / "for_colossalai.ckpt"
    assert cli(["convert", str(full), str(out), "--to", "colossalai"]) == 0
    assert "resume it with the colossalai strategies" in capsys.readouterr().out
    assert out.read_bytes() == full.read_bytes()

    # Optimizer states keyed by name (FSDP2's) go as they are: the colossalai strategies number them on load.
    named = read(full)
    named["optimizer_states"][0]["state"] = {
        f"layer.{key}": value for key, value in named["optimizer_states"][0]["state"].items()
    }
    torch.save(named, tmp_path / "named.ckpt")
    assert cli(["convert", str(tmp_path / "named.ckpt"), str(tmp_path / "copy.ckpt"), "--to", "colossalai"]) == 0
    assert (tmp_path / "copy.ckpt").read_bytes() == (tmp_path / "named.ckpt").read_bytes()


def test_a_fabric_optimizer_under_its_own_key_goes_too(registry, tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(), "step": 1}, tmp_path / "fabric.ckpt")
    out = tmp_path / "weights.ckpt"
    assert cli(["convert", str(tmp_path / "fabric.ckpt"), str(out), "--to", "full", "--drop-optimizer-states"]) == 0
    assert read(out).keys() == {"model", "step"}


def test_a_long_step_says_how_much_it_has_written(
    registry, full: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that takes minutes on a large checkpoint (one file written, a scratch layout) is not silent."""
    from lightning_strategies.checkpoints import STAGING_FOLDER
    from lightning_strategies.checkpoints import convert as converting

    write_full = converting._write_full

    def slowly(found, source, out, *arguments) -> None:
        staging = out.parent / STAGING_FOLDER
        staging.mkdir(exist_ok=True)
        (staging / "part").write_bytes(b"\0" * 3 * 2**20)  # what a save has written so far
        time.sleep(0.3)
        (staging / "part").unlink()
        write_full(found, source, out, *arguments)

    monkeypatch.setattr(converting, "PROGRESS_EVERY", 0.05)
    monkeypatch.setattr(converting, "_write_full", slowly)
    assert cli(["convert", str(full), str(tmp_path / "weights.ckpt"), "--to", "full", "--drop-optimizer-states"]) == 0
    lines = capsys.readouterr().err.splitlines()
    progress = [line for line in lines if "written so far" in line]
    assert progress and progress[0].startswith("... 3.0 MiB written so far (the source holds "), lines
    assert lines.index(progress[0]) < next(index for index, line in enumerate(lines) if line.startswith("done: "))
