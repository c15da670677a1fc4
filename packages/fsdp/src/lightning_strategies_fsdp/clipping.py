"""Gradient clipping by norm over FSDP2's sharded gradients, wherever they are held.

torch's ``clip_grad_norm_`` reduces the norm of DTensor gradients with a collective over the mesh's
process groups, on the gradients' own device. With CPU offload the gradients are CPU DTensors on a
CUDA mesh, and an NCCL group cannot carry CPU tensors: "No backend type associated with device
type cpu" (two H200s, 2026-11-22), even with gloo requested beside NCCL for the mesh, since torch
may hand the mesh the process's NCCL-only default group. So the norm is summed here shard by
shard, on whichever device the gradients are, and only one scalar crosses the mesh, on the mesh's
own device, where its groups always have a backend.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> torch.Tensor:
    """Scale the gradients in place so their total norm is at most ``max_norm``; return the norm before."""
    parameters = list(parameters)
    gradients = _sharded_gradients(parameters)
    if gradients is None:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)  # torch's own
    total = _sharded_norm(gradients, norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} of the gradients is non-finite ({total.item()}), so they cannot be "
            "clipped. Check the loss for NaN or inf, or pass error_if_nonfinite=False to clip anyway."
        )
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for gradient in gradients:
        shard = gradient.to_local()
        shard.mul_(coefficient.to(shard.device, shard.dtype))
    return total


@torch.no_grad()
def total_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients together, as if unsharded; safe to call for logging, e.g. under CPU offload."""
    parameters = list(parameters)
    gradients = _sharded_gradients(parameters)
    if gradients is not None:
        return _sharded_norm(gradients, norm_type)
    plain = [parameter.grad for parameter in parameters if parameter.grad is not None]
    return torch.nn.utils.get_total_norm(plain, norm_type) if plain else torch.tensor(0.0)


def _sharded_gradients(parameters: list[torch.Tensor]) -> list[DTensor] | None:
    """The gradients where every one is a DTensor on one mesh (FSDP2's); None otherwise, for torch's own path."""
    gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
    sharded = [gradient for gradient in gradients if isinstance(gradient, DTensor)]
    if not sharded or len(sharded) != len(gradients):
        return None
    mesh = sharded[0].device_mesh
    return sharded if all(gradient.device_mesh == mesh for gradient in sharded) else None


def _sharded_norm(gradients: list[DTensor], norm_type: float) -> torch.Tensor:
    """Sum the shards' norms here, on their own device, and reduce one scalar on the mesh's device."""
    mesh, placements = gradients[0].device_mesh, gradients[0].placements
    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
    norms = torch.stack(
        [torch.linalg.vector_norm(g.to_local(), norm_type, dtype=torch.float32).to(device) for g in gradients]
    )
    infinite = math.isinf(norm_type)
    total = norms.max() if infinite else norms.pow(norm_type).sum()
    # Replicated mesh dimensions (HSDP's replicas) hold the same shards: reduce over the sharded ones only.
    for dimension, placement in enumerate(placements):
        if isinstance(placement, Shard):
            operation = dist.ReduceOp.MAX if infinite else dist.ReduceOp.SUM
            dist.all_reduce(total, op=operation, group=mesh.get_group(dimension))
    return total if infinite else total.pow(1.0 / norm_type)
