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
    parameters = [parameter for parameter in parameters if parameter.grad is not None]
    if not sharded_alike(parameters):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)  # torch's own
    total = total_norm(parameters, norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} of the gradients is non-finite ({total.item()}), so they cannot be "
            "clipped. Check the loss for NaN or inf, or pass error_if_nonfinite=False to clip anyway."
        )
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for gradient in [parameter.grad for parameter in parameters]:
        if isinstance(gradient, DTensor):  # all are (sharded_alike); the check is for the type checker
            shard = gradient.to_local()
            shard.mul_(coefficient.to(shard.device, shard.dtype))
    return total


@torch.no_grad()
def total_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients together, as if unsharded; safe to call for logging, e.g. under CPU offload."""
    gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not gradients:
        return torch.tensor(0.0)
    sharded = [gradient for gradient in gradients if isinstance(gradient, DTensor)]
    if not sharded_alike(gradients, holders=False):
        return torch.nn.utils.get_total_norm(gradients, norm_type)
    mesh, placements = sharded[0].device_mesh, sharded[0].placements
    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
    shards = [gradient.to_local() for gradient in sharded]
    norms = torch.stack([torch.linalg.vector_norm(s, norm_type, dtype=torch.float32).to(device) for s in shards])
    infinite = math.isinf(norm_type)
    total = norms.max() if infinite else norms.pow(norm_type).sum()
    # Replicated mesh dimensions (HSDP's replicas) hold the same shards: reduce over the sharded ones only.
    for dimension, placement in enumerate(placements):
        if isinstance(placement, Shard):
            operation = dist.ReduceOp.MAX if infinite else dist.ReduceOp.SUM
            dist.all_reduce(total, op=operation, group=mesh.get_group(dimension))
    return total if infinite else total.pow(1.0 / norm_type)


def sharded_alike(tensors: list[torch.Tensor], holders: bool = True) -> bool:
    """Whether every gradient (of ``tensors``, or the tensors themselves) is a DTensor on one mesh."""
    gradients = [tensor.grad if holders else tensor for tensor in tensors]
    first = gradients[0] if gradients else None
    return isinstance(first, DTensor) and all(
        isinstance(gradient, DTensor) and gradient.device_mesh == first.device_mesh for gradient in gradients
    )
