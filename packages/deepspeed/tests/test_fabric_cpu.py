"""The Fabric strategy on 2 CPU processes: training lowers the loss; save and load restore the weights,
also after a later save to the same path failed half way, and the user's entries named like DeepSpeed's;
no_backward_sync warns and goes on, as with Lightning's DeepSpeed strategy. Both names run one after the
other in one launch (fabric_script.py --runs), each with its own Fabric and folder."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import HERE, clean_environment

from lightning_strategies_deepspeed.checkpoint import convert_zero_checkpoint

NAMES = ["deepspeed_stage_2", "deepspeed_stage_3"]


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """Both names, one after another in one launch of 2 processes (a new Fabric each); each in its own folder."""
    folders = {name: tmp_path_factory.mktemp(name) for name in NAMES}
    runs = [{"strategy": name, "checkpoint": str(folder / "fabric.ckpt"), "out": str(folder / "result.json")}
            for name, folder in folders.items()]  # fmt: skip
    command = [sys.executable, str(HERE / "fabric_script.py"), "--runs", json.dumps(runs)]
    result = subprocess.run(command, capture_output=True, text=True, env=clean_environment(), timeout=600)
    return result, folders


@pytest.mark.parametrize("name", NAMES)
def test_fabric_trains_saves_and_loads(launch, name):
    result, folders = launch
    folder = folders[name]
    assert result.returncode == 0, result.stderr[-5000:]
    report = json.loads((folder / "result.json").read_text())
    assert report["strategy_class"] == "DeepSpeedFabricStrategy"
    assert report["losses"][-1] < report["losses"][0]
    assert report["step"] == 6
    assert report["restored"] == report["trained"]
    assert report["failed_save"] == "injected failure mid-save"
    assert report["trained_further"] != report["trained"]  # so the failed save had something else to write
    assert [path.name for path in folder.glob("*.ckpt")] == ["fabric.ckpt"]
    assert report["missing"].startswith("The provided path is not a valid DeepSpeed checkpoint")
    assert "No checkpoint at that path" in report["missing"] and "missing.ckpt" in report["missing"]
    assert report["user_state"] == {"step": 6, "global_steps": 60, "mp_world_size": 4}
    assert report["restored_engine_steps"] == report["engine_steps"]  # DeepSpeed's own count, not the user's 60
    assert any("does not support skipping the gradient synchronization" in text for text in report["no_sync_warnings"])
    # Converted to full weights, the user's entries are there too.
    assert convert_zero_checkpoint(folder / "fabric.ckpt")["global_steps"] == 60
