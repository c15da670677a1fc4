"""GPU tier: every name trains a small GPT on one GPU and on the machine's several GPUs
(``min(4, torch.cuda.device_count())``: 2 on a two-GPU machine, 4 on a four-GPU one), a new Trainer in the
same processes resumes and tests each, checkpoints saved on the several GPUs go on on fewer (2 and 1 on four,
1 on two), and clipping by norm is the same with offload as without.

Runs are grouped into one launch per device count (gpt_script.py), so the tier pays once for
importing DeepSpeed and joining NCCL; each test reads its own run's results. Run on the GPU machine:
``pytest packages/deepspeed/tests -m gpu``. Not run in CI (no GPU there).
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
SEVERAL = min(4, GPUS)  # the GPUs the multi-GPU runs train on
CLIP = 0.5  # below the tiny GPT's early gradient norms, so clipping acts
# NVMe names last: where libaio is missing they fail in set-up, and a failed set-up must not be
# what the other runs in the same processes come after.
ORDERED_NAMES = sorted(NAMES, key=lambda name: "nvme" in name)
OFFLOAD_PAIRS = [("deepspeed_stage_2", "deepspeed_stage_2_offload"), ("deepspeed_stage_3", "deepspeed_stage_3_offload")]


def launch(folder: Path, runs: list[dict], environment: dict[str, str] | None = None) -> dict[str, dict]:
    """Run ``runs`` one after another in one launch; return their results by run key."""
    out = folder / "results.json"
    command = [sys.executable, str(HERE / "gpt_script.py"), "--runs", json.dumps(runs), "--folder", str(folder),
               "--out", str(out)]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, env=environment or clean_environment(),
                              timeout=900)  # fmt: skip
    assert out.is_file(), f"no results (exit {finished.returncode}):\n{finished.stderr[-6000:]}"
    return json.loads(out.read_text())


def succeeded(results: dict[str, dict], key: str) -> dict:
    assert key in results, f"{key} did not run; ran: {sorted(results)}"
    result = results[key]
    assert "error" not in result, result.get("traceback", result.get("error"))
    assert result["finite"] and result["last_loss"] < result["first_loss"], result
    return result


def libaio_available() -> bool:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return AsyncIOBuilder().is_compatible(verbose=False)


def expect_missing_libaio(result: dict) -> None:
    # Seen on the H200 image, which lacks libaio-dev: the error must say what to install.
    assert "apt-get install libaio-dev" in result.get("error", ""), result


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    if GPUS < 1:
        pytest.skip("needs a CUDA GPU")
    runs = [
        {"strategy": "deepspeed_stage_2", "devices": 1, "precision": "16-mixed", "resume": True},
        # GPU images set TORCH_CUDA_ARCH_LIST=9.0a; DeepSpeed's FusedAdam JIT build must still work.
        {"strategy": "deepspeed_stage_2", "devices": 1, "config_optimizer": True},
        # Half of the optimizer offloaded: gradients accumulate beside their optimizer (gradient_buffers.py).
        {"strategy": "deepspeed_stage_3", "devices": 1, "offload_ratio": 0.5, "accumulate": 2, "resume": True},
        # The same with the offloaded share accumulating in its fp32 gradients (the plan's choice for 13B).
        {
            "strategy": "deepspeed_stage_3",
            "devices": 1,
            "offload_ratio": 0.5,
            "accumulate": 2,
            "resume": True,
            "fp32_host_gradients": True,
        },
        # The same with the offloaded share accumulating on the GPU until the optimizer step.
        {
            "strategy": "deepspeed_stage_3",
            "devices": 1,
            "offload_ratio": 0.5,
            "accumulate": 2,
            "resume": True,
            "gradients_on_gpu": True,
        },
    ]
    runs += [{"strategy": name, "devices": 1} for name in ORDERED_NAMES]
    environment = {**clean_environment(), "TORCH_CUDA_ARCH_LIST": "9.0a"}
    return launch(tmp_path_factory.mktemp("one-gpu"), runs, environment)


def several_gpu_runs(devices: int) -> list[dict]:
    """The runs of the several-GPU launch: clipping with and without offload, then every name fits, saves and
    resumes."""
    runs = [{"strategy": name, "devices": devices, "clip": CLIP} for pair in OFFLOAD_PAIRS for name in pair]
    runs += [{"strategy": name, "devices": devices, "resume": True} for name in ORDERED_NAMES]
    return runs


@pytest.fixture(scope="module")
def several_gpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    if SEVERAL < 2:
        pytest.skip("needs 2 or more CUDA GPUs")
    return launch(tmp_path_factory.mktemp("several-gpus"), several_gpu_runs(SEVERAL))


# The first of these pays for the one-GPU launch of eleven runs: 206 s alone on one H200, over the tier's 240 s
# per-test limit beside the other packages' streams on the same GPU.
@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", list(NAMES))
def test_every_name_trains_gpt_on_one_gpu(one_gpu, name):
    if "nvme" in name and not libaio_available():
        return expect_missing_libaio(one_gpu[f"{name}-1gpu-bf16-mixed"])
    result = succeeded(one_gpu, f"{name}-1gpu-bf16-mixed")
    assert result["deepspeed_accelerator"] == "cuda"


def test_fp16_mixed_with_dynamic_loss_scaling_saves_and_resumes(one_gpu):
    """fp16 puts DeepSpeed's loss scaler into the checkpoint: Lightning's state must still load with
    weights_only=True, DeepSpeed's optimizer-state files with False (README, Reliability)."""
    result = succeeded(one_gpu, "deepspeed_stage_2-1gpu-16-mixed")
    assert result["config"]["fp16"]["enabled"] is True
    assert result["saved_tag_file"] and (result["resumed_global_step"], result["resumed_steps_run"]) == (20, 10)


def test_fused_adam_builds_with_hopper_arch_list(one_gpu):
    succeeded(one_gpu, "deepspeed_stage_2-1gpu-bf16-mixed-fused")


@pytest.mark.parametrize(
    ("suffix", "dtypes"),
    [
        ("", {"cpu": ["torch.bfloat16"], "cuda": ["torch.float32"]}),
        ("-fp32-host-gradients", {"cpu": ["torch.float32"], "cuda": ["torch.float32"]}),
        ("-gradients-on-gpu", {"cpu": [], "cuda": ["torch.bfloat16", "torch.float32"]}),
    ],
)
def test_partial_offload_keeps_each_gradient_beside_its_optimizer_and_resumes(one_gpu, suffix, dtypes):
    result = succeeded(one_gpu, f"deepspeed_stage_3-1gpu-bf16-mixed-offload0.5-accumulate2{suffix}")
    slots = result["gradient_slots"]
    # The GPU-held sub-groups' slots are their fp32 gradients there; the offloaded ones share one pinned 16-bit
    # buffer, or with offloaded_gradients_in_fp32 are their pinned fp32 gradients on the host, or with
    # offloaded_gradients_on_gpu share one 16-bit buffer on the GPU.
    on_host = dtypes["cpu"] != []
    assert slots.get("cuda", 0) > 0 and (slots.get("cpu", 0) > 0) == on_host, slots
    assert slots["host_pinned"] == on_host, slots
    assert slots["dtypes"] == dtypes, slots
    assert result["resumed_gradient_slots"] == slots  # a new Trainer that resumes places them the same way
    assert result["saved_tag_file"] and (result["resumed_global_step"], result["resumed_steps_run"]) == (20, 20)
    assert result["resumed_last_loss"] < result["first_loss"] and result["test_loss"] < result["first_loss"]


@pytest.mark.parametrize("name", list(NAMES))
def test_several_gpus_every_name_fits_then_a_new_trainer_resumes_and_tests(several_gpus, name):
    if "nvme" in name and not libaio_available():
        return expect_missing_libaio(several_gpus[f"{name}-{SEVERAL}gpu-bf16-mixed"])
    result = succeeded(several_gpus, f"{name}-{SEVERAL}gpu-bf16-mixed")
    assert result["world_size"] == result["resumed_world_size"] == SEVERAL
    assert result["saved_tag_file"] and (result["resumed_global_step"], result["resumed_steps_run"]) == (20, 10)
    assert result["resumed_last_loss"] < result["first_loss"] and result["test_loss"] < result["first_loss"]


@pytest.mark.parametrize(("plain", "offloaded"), OFFLOAD_PAIRS)
def test_several_gpus_clipping_with_offload_sees_the_same_total_norm(several_gpus, plain, offloaded):
    """Clipping acts on the global norm; offloading the optimizer to the CPU must not change it."""
    without = succeeded(several_gpus, f"{plain}-{SEVERAL}gpu-bf16-mixed-clip{CLIP}")
    with_offload = succeeded(several_gpus, f"{offloaded}-{SEVERAL}gpu-bf16-mixed-clip{CLIP}")
    assert without["world_size"] == with_offload["world_size"] == SEVERAL
    without, with_offload = without["grad_norms"], with_offload["grad_norms"]
    assert len(without) == len(with_offload) == 10
    assert without[0] > CLIP  # clipping acted
    # The first step's gradients come from identical weights; later ones drift with bf16 rounding.
    assert with_offload[0] == pytest.approx(without[0], rel=1e-3)
    assert with_offload == pytest.approx(without, rel=0.05)


RESHARDED = ("deepspeed_stage_2", "deepspeed_stage_3")
FEWER = [devices for devices in (2, 1) if devices < SEVERAL]  # 2 and 1 on a four-GPU machine, 1 on a two-GPU one


@pytest.fixture(scope="module")
def fewer_gpus_from_several(several_gpus: dict[str, dict], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The several-GPU runs' checkpoints (saved after 10 steps) resumed on fewer GPUs to 20 steps, by ckpt_path
    alone: one launch per GPU count."""
    results: dict[str, dict] = {}
    for devices in FEWER:
        runs = [
            {"strategy": name, "devices": devices, "steps": 20,
             "resume_from": succeeded(several_gpus, f"{name}-{SEVERAL}gpu-bf16-mixed")["checkpoint"]}
            for name in RESHARDED
        ]  # fmt: skip
        results.update(launch(tmp_path_factory.mktemp(f"{devices}-from-several"), runs))
    return results


@pytest.mark.parametrize("devices", FEWER)
@pytest.mark.parametrize("name", RESHARDED)
def test_several_gpus_checkpoint_goes_on_on_fewer_gpus(several_gpus, fewer_gpus_from_several, name, devices):
    """Converted once to DeepSpeed's universal layout beside the saved tag folder (universal.py), then loaded: the
    run goes on from step 10 with its weights, not from scratch."""
    saved = several_gpus[f"{name}-{SEVERAL}gpu-bf16-mixed"]
    result = fewer_gpus_from_several[f"{name}-{devices}gpu-bf16-mixed-resumed"]
    assert "error" not in result, result.get("traceback", result.get("error"))
    assert result["world_size"] == devices and (result["global_step"], result["steps_run"]) == (20, 10)
    assert Path(saved["checkpoint"], "checkpoint-universal", "latest_universal").is_file()
    # It begins where the saved run ended, not where a model started afresh begins (near ln(256), as the saved run).
    assert result["finite"], result
    assert abs(result["first_loss"] - saved["last_loss"]) < abs(result["first_loss"] - saved["first_loss"]), (
        result, saved)  # fmt: skip
