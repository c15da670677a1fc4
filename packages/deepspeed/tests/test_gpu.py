"""GPU tier: every name trains a small GPT-style model on one GPU; stages 2 and 3 on two GPUs.

Run on the GPU machine: ``pytest packages/deepspeed/tests -m gpu``. Not run in CI (no GPU there).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import clean_environment

from lightning_strategies_deepspeed.plugin import NAMES

pytestmark = pytest.mark.gpu
HERE = Path(__file__).parent
GPUS = torch.cuda.device_count()


def launch_gpt(
    tmp_path: Path, name: str, devices: int, precision: str = "bf16-mixed", extra: list[str] = ()
) -> subprocess.CompletedProcess:
    environment = clean_environment()
    command = [sys.executable, str(HERE / "gpt_script.py"), "--strategy", name, "--devices", str(devices),
               "--precision", precision, "--nvme-path", str(tmp_path), "--out", str(tmp_path / "result.json"),
               *extra]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=1200)


def run_gpt(tmp_path: Path, name: str, devices: int, precision: str = "bf16-mixed", extra: list[str] = ()) -> dict:
    result = launch_gpt(tmp_path, name, devices, precision, extra)
    assert result.returncode == 0, result.stderr[-6000:]
    return json.loads((tmp_path / "result.json").read_text())


def libaio_available() -> bool:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return AsyncIOBuilder().is_compatible(verbose=False)


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(NAMES))
def test_every_name_trains_gpt_on_one_gpu(tmp_path, name):
    if "nvme" in name and not libaio_available():
        # Seen on the H200 image, which lacks libaio-dev: the error must say what to install.
        failed = launch_gpt(tmp_path, name, devices=1)
        assert failed.returncode != 0 and "apt-get install libaio-dev" in failed.stderr, failed.stderr[-3000:]
        return
    result = run_gpt(tmp_path, name, devices=1)
    assert result["deepspeed_accelerator"] == "cuda"
    assert result["last_loss"] < result["first_loss"]


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("name", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_stages_train_gpt_on_two_gpus(tmp_path, name):
    result = run_gpt(tmp_path, name, devices=2)
    assert result["last_loss"] < result["first_loss"]


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_fp16_mixed_with_dynamic_loss_scaling(tmp_path):
    result = run_gpt(tmp_path, "deepspeed_stage_2", devices=1, precision="16-mixed")
    assert result["config"]["fp16"]["enabled"] is True
    assert result["last_loss"] < result["first_loss"]


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_fused_adam_builds_with_hopper_arch_list(tmp_path, monkeypatch):
    """GPU images set TORCH_CUDA_ARCH_LIST=9.0a; DeepSpeed's FusedAdam JIT build must still work."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    result = run_gpt(tmp_path, "deepspeed_stage_2", devices=1, extra=["--config-optimizer"])
    assert result["last_loss"] < result["first_loss"]


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    ("name", "precision"), [("deepspeed_stage_2", "16-mixed"), ("deepspeed_stage_3", "bf16-mixed")]
)
def test_resume_with_default_weights_only_in_gpu_precisions(tmp_path, name, precision):
    """fp16 puts DeepSpeed's loss scaler into the checkpoint: Lightning's state must still load with
    weights_only=True, DeepSpeed's optimizer-state files with False (README, Reliability)."""
    devices = min(GPUS, 2)
    checkpoint = tmp_path / "run.ckpt"
    run_gpt(tmp_path, name, devices, precision, extra=["--steps", "10", "--save", str(checkpoint)])
    assert (checkpoint / "latest").is_file() and not (tmp_path / ".lightning-strategies-staging" / "run.ckpt").exists()
    resumed = run_gpt(tmp_path, name, devices, precision, extra=["--steps", "20", "--resume", str(checkpoint)])
    assert resumed["global_step"] == 20 and resumed["steps_run"] == 10
