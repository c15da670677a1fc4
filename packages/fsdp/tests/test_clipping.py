"""Clipping by norm over FSDP2 shards (clipping.py) against torch's clipping of the unsharded model,
on two CPU processes over gloo."""

from __future__ import annotations

import gc
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from lightning_strategies.testing import free_port, run_script
from lightning_strategies_fsdp.clipping import clip_grad_norm_


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # same weights on every rank and in the reference
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))  # 16 rows: uneven


def backward(module: torch.nn.Module) -> None:
    batch = torch.arange(32, dtype=torch.float32).reshape(4, 8) / 10
    module(batch).pow(2).sum().backward()


def reference_clipped(norm_type: float = 2.0) -> tuple[torch.Tensor, torch.nn.Module]:
    reference = model()
    backward(reference)
    return torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=0.5, norm_type=norm_type), reference


def clip_on_two_ranks(rank: int, port: int, norm_type: float, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        clip_and_save(rank, norm_type, out)
    finally:
        # The model's device meshes, and their process groups, are collected before the group ends: left to
        # interpreter exit, they abort the process ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()


def clip_and_save(rank: int, norm_type: float, out: Path) -> None:
    sharded = model()
    for layer in (sharded[0], sharded[2]):
        fully_shard(layer, mesh=init_device_mesh("cpu", (2,)))
    fully_shard(sharded, mesh=init_device_mesh("cpu", (2,)))
    backward(sharded)  # the same batch on both ranks: the averaged gradients equal one rank's
    norm = clip_grad_norm_(sharded.parameters(), max_norm=0.5, norm_type=norm_type)
    gradients = [parameter.grad.full_tensor() for parameter in sharded.parameters()]
    if rank == 0:
        torch.save({"norm": norm, "gradients": gradients}, out)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_sharded_clipping_equals_torchs_on_the_whole_model(tmp_path: Path, norm_type: float) -> None:
    out = tmp_path / "clipped.pt"
    mp.spawn(clip_on_two_ranks, args=(free_port(), norm_type, out), nprocs=2)
    expected_norm, reference = reference_clipped(norm_type)
    result = torch.load(out, weights_only=True)
    assert expected_norm > 0.5  # clipping acted
    assert torch.allclose(result["norm"], expected_norm, rtol=1e-5)
    for got, parameter in zip(result["gradients"], reference.parameters(), strict=True):
        assert torch.allclose(got, parameter.grad, rtol=1e-5, atol=1e-7)


def test_fabric_clip_gradients_clips_shard_by_shard(tmp_path: Path) -> None:
    """fabric.clip_gradients goes through the strategy's clip_gradients_norm, which uses clipping.py. On CPU
    torch's own clipping also works (gloo carries CPU tensors): this holds ours equal to it; the failure it
    replaces needs CPU-offloaded shards on a CUDA mesh (test_gpu.py)."""
    out = tmp_path / "fabric.pt"
    run_script(Path(__file__).parent / "scripts" / "fabric_clipping.py", out, timeout=300)
    expected_norm, reference = reference_clipped()
    result = torch.load(out, weights_only=True)
    assert torch.allclose(result["norm"], expected_norm, rtol=1e-5)
    for got, parameter in zip(result["gradients"], reference.parameters(), strict=True):
        assert torch.allclose(got, parameter.grad, rtol=1e-5, atol=1e-7)
