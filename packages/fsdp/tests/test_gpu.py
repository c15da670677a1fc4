"""GPU tier (run with `pytest packages/fsdp/tests -m gpu` on the GPU machine): the CPU scenarios on CUDA,
fp16 with its gradient scaler, CPU offload next to a GPU, and torch.compile with inductor.

The multi-GPU tests run on the machine's several GPUs, ``min(4, torch.cuda.device_count())``: 2 on a two-GPU
machine, 4 on a four-GPU one (where fsdp_hybrid_shard also trains on a 2x2 replicate x shard mesh)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import read, run_group

from lightning_strategies.conformance.launching import fresh_launch_environment
from lightning_strategies_fsdp.plugin import NAMES

pytestmark = pytest.mark.gpu

needs_one_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SEVERAL = min(4, torch.cuda.device_count())  # the GPUs the multi-GPU tests train on
needs_several_gpus = pytest.mark.skipif(SEVERAL < 2, reason="needs 2 or more CUDA GPUs")


@pytest.fixture()
def on_several_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenarios (and the processes Lightning launches for them) run on CUDA, one process per GPU."""
    monkeypatch.setenv("FSDP_SCENARIO_ACCELERATOR", "cuda")
    monkeypatch.setenv("FSDP_SCENARIO_DEVICES", str(SEVERAL))


def hybrid_variant(devices: int) -> tuple[str, list[int]]:
    """The label and mesh of the names group's explicit hybrid run: 2 replicas of devices // 2 shards
    (2x2 on four GPUs, 2x1 on two), as scenarios.group_names chooses it."""
    replicas = 2 if devices % 2 == 0 else devices
    return f"fsdp_hybrid_shard_{replicas}x{devices // replicas}", [replicas, devices // replicas]


def _tiny_fit(strategy, precision: str, compile_backend: str | None = None):
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "scripts"))
    import scenarios

    scenarios.ACCELERATOR = "cuda"
    module = scenarios.TinyTransformer(compile_backend=compile_backend)
    trainer = scenarios.trainer(strategy, steps=3, devices=1, precision=precision)
    trainer.fit(module, scenarios.loader(), scenarios.loader())
    return trainer, module


@needs_one_gpu
def test_one_gpu_fp16_mixed_uses_a_gradient_scaler() -> None:
    trainer, module = _tiny_fit("fsdp", "16-mixed")
    assert trainer.precision_plugin.scaler is not None
    assert module.seen_compute_dtypes == {"torch.float16"}
    assert {param.dtype for param in module.parameters()} == {torch.float32}
    assert math.isfinite(float(trainer.callback_metrics["train_loss"]))


@needs_one_gpu
def test_one_gpu_bf16_mixed_and_cpu_offload() -> None:
    trainer, module = _tiny_fit("fsdp_cpu_offload", "bf16-mixed")
    assert module.seen_compute_dtypes == {"torch.bfloat16"}
    assert {param.device.type for param in module.parameters()} == {"cpu"}  # shards live in host memory
    assert math.isfinite(float(trainer.callback_metrics["train_loss"]))


@needs_one_gpu
def test_one_gpu_torch_compile_with_inductor() -> None:
    trainer, module = _tiny_fit("fsdp", "bf16-mixed", compile_backend="inductor")
    assert all(block._compiled_call_impl is not None for block in module.blocks)
    assert math.isfinite(float(trainer.callback_metrics["train_loss"]))


@needs_several_gpus
def test_several_gpus_every_name_trains_saves_and_resumes(on_several_gpus: None, tmp_path: Path) -> None:
    out = run_group("names", tmp_path / "names")
    hybrid_label, hybrid_mesh = hybrid_variant(SEVERAL)
    expected_mesh = {
        "fsdp": [SEVERAL],
        "fsdp_cpu_offload": [SEVERAL],
        "fsdp_shard_grad_op": [SEVERAL],
        "fsdp_hybrid_shard": [1, SEVERAL],  # one node: 1 replica x SEVERAL shards
        "fsdp_no_shard": [SEVERAL, 1],
        hybrid_label: hybrid_mesh,  # on four GPUs a real 2x2 replicate x shard mesh
    }
    for label, mesh in expected_mesh.items():
        result = read(out, label)
        assert result["mesh_shape"] == mesh, label  # every name really ran on the several GPUs
        assert result["checkpoint_is_folder"], label
        assert result["resumed_weights_equal_saved"], label
        assert result["resumed_global_step"] == 4, label
        assert math.isfinite(result["resumed_train_loss"]), label
    assert set(NAMES) < expected_mesh.keys()  # every registered name
    assert read(out, "fsdp_cpu_offload")["param_devices"] == ["cpu"]


@needs_several_gpus
def test_several_gpus_resume_equals_uninterrupted_and_loads_on_one(on_several_gpus: None, tmp_path: Path) -> None:
    reference = run_group("reference", tmp_path / "reference")
    (checkpoint,) = (reference / "every_4").iterdir()
    out = run_group("resume", tmp_path / "resume", "--checkpoint", str(checkpoint), "--tag", "gpu")
    assert read(out, "resume_gpu")["world_size"] == SEVERAL
    resumed = torch.load(out / "resumed_8_gpu.pt", weights_only=True)
    uninterrupted = torch.load(reference / "uninterrupted_8.pt", weights_only=True)
    for key in uninterrupted:
        torch.testing.assert_close(resumed[key], uninterrupted[key], rtol=1e-4, atol=1e-5)
    one = run_group(
        "resume", tmp_path / "one", "--checkpoint", str(reference / "sharded_4"), "--devices", "1", "--tag", "one"
    )
    assert read(one, "resume_one")["world_size"] == 1


@needs_several_gpus
def test_several_gpus_fabric(on_several_gpus: None, tmp_path: Path) -> None:
    result = read(run_group("fabric", tmp_path / "fabric"), "fabric")
    assert result["world_size"] == SEVERAL
    assert result["loaded_weights_equal"]
    assert result["optimizer_state_loaded"]


@needs_several_gpus
def test_several_gpus_clipping_with_cpu_offload_matches_without(on_several_gpus: None, tmp_path: Path) -> None:
    """Offloaded gradients are CPU tensors: their norm must still be reduced across ranks (it was refused
    on an NCCL-only process group) and clip to the same total norm as gradients held on the GPU."""
    import json
    import subprocess
    import sys

    script = Path(__file__).parent / "scripts" / "clipping.py"
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=400,
        env=fresh_launch_environment(),
    )
    assert completed.returncode == 0, completed.stderr[-6000:]
    result = json.loads((tmp_path / "clipping.json").read_text())
    assert result["world_size"] == SEVERAL
    plain, offloaded = result["fsdp"], result["fsdp_cpu_offload"]
    assert all(norm > result["clip"] for norm in plain["before"])  # every step really clipped
    assert offloaded["before"] == pytest.approx(plain["before"], rel=1e-4)
    assert offloaded["after"] == pytest.approx([result["clip"]] * len(plain["after"]), rel=1e-3)
    assert plain["after"] == pytest.approx(offloaded["after"], rel=1e-4)
    assert result["weights_close"]
