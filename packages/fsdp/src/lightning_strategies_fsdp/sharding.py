"""Applying FSDP2 to a model: which modules a policy selects, then ``fully_shard`` bottom-up on them and the root.

Shared by the Trainer and the Fabric strategy, and by the benchmark's by-hand baseline, so
all three shard a model the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

from lightning_strategies.hugging_face import (
    PretrainedWeights,
    hugging_face_models,
    initialize,
    load_pending,
    move_buffers,
)
from lightning_strategies_fsdp.float8 import scale_float8_weights_before
from lightning_strategies_fsdp.options import ShardingOptions, mesh_shape

MESH_DIM_NAMES = {1: ("shard",), 2: ("replicate", "shard")}


def build_mesh(options: ShardingOptions, device: torch.device, world_size: int, num_nodes: int) -> DeviceMesh:
    """The data-parallel mesh: 1-D for FULL_SHARD / SHARD_GRAD_OP, 2-D (replicate, shard) otherwise."""
    if isinstance(options.device_mesh, DeviceMesh):
        return options.device_mesh
    shape = mesh_shape(options, world_size, num_nodes)
    backends = mesh_backends(options, device, len(shape))
    override: dict[str, Any] = {"backend_override": backends} if backends else {}  # an argument since torch 2.7 or so
    return init_device_mesh(device.type, shape, mesh_dim_names=MESH_DIM_NAMES[len(shape)], **override)


def mesh_backends(options: ShardingOptions, device: torch.device, dimensions: int) -> dict[int, str] | None:
    """Offloaded gradients are CPU DTensors on a CUDA mesh: clip_grad_norm_ reduces their norm over the
    mesh's groups, which NCCL alone cannot carry ("No backend type associated with device type cpu",
    seen on two H200s). Those groups get gloo for CPU tensors, whichever backend the default group has
    (an earlier Trainer in the process may have made it NCCL-only)."""
    if device.type != "cuda" or not isinstance(options.offload_policy, CPUOffloadPolicy):
        return None
    return dict.fromkeys(range(dimensions), "cpu:gloo,cuda:nccl")


# Module selection: which submodules a wrap policy (auto-wrap or activation checkpointing) picks.


def block_classes(policy: Any) -> set[type] | None:
    """The module classes a policy names, where it is a plain set or a ModuleWrapPolicy."""
    if isinstance(policy, (set, frozenset, list, tuple)):
        return set(policy)
    module_classes = getattr(policy, "_module_classes", None)  # torch.distributed.fsdp.wrap.ModuleWrapPolicy
    if module_classes is not None:
        return set(module_classes)
    keywords = getattr(policy, "keywords", None)  # functools.partial(transformer_auto_wrap_policy, ...)
    if keywords and "transformer_layer_cls" in keywords:
        return set(keywords["transformer_layer_cls"])
    return None


def default_blocks(root: nn.Module) -> list[nn.Module]:
    """Transformer-style repeated blocks: members of a ModuleList/Sequential that share a class.

    Sharding each block (and the root) is what FSDP2 recommends: one all-gather per block,
    overlapped with the previous block's compute.
    """
    blocks: list[nn.Module] = []
    for container in root.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)) or len(container) < 2:
            continue
        children = [child for child in container if any(True for _ in child.parameters())]
        kinds = {type(child) for child in children}
        if len(children) >= 2 and len(kinds) == 1 and not issubclass(kinds.pop(), (nn.Linear, nn.Embedding)):
            blocks.extend(children)
    standard = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
    blocks.extend(module for module in root.modules() if isinstance(module, standard) and module not in blocks)
    return blocks


def selected_modules(
    root: nn.Module, policy: Any, default: Callable[[nn.Module], list[nn.Module]] | None
) -> list[nn.Module]:
    """The submodules of ``root`` (root excluded) a wrap policy selects, outermost first."""
    if policy is None:
        chosen: Iterable[nn.Module] = default(root) if default else []
    elif (classes := block_classes(policy)) is not None:
        chosen = [module for module in root.modules() if isinstance(module, tuple(classes))]
    elif hasattr(policy, "_run_policy"):  # other torch.distributed.fsdp.wrap policies (CustomPolicy ...)
        chosen = list(policy._run_policy(root, set(), {}))
    else:
        chosen = _run_callable_policy(root, policy)
    chosen_ids = {id(module) for module in chosen}
    return [module for module in root.modules() if id(module) in chosen_ids and module is not root]


def _run_callable_policy(root: nn.Module, policy: Callable[..., bool]) -> list[nn.Module]:
    """FSDP1's callable contract: asked bottom-up with the number of parameters not yet wrapped below."""
    chosen: list[nn.Module] = []

    def visit(module: nn.Module) -> int:
        unwrapped = sum(visit(child) for child in module.children())
        unwrapped += sum(param.numel() for param in module.parameters(recurse=False))
        if module is not root and policy(module=module, recurse=False, nonwrapped_numel=unwrapped):
            chosen.append(module)
            return 0
        return unwrapped

    visit(root)
    return chosen


def shard_model(
    module: nn.Module,
    options: ShardingOptions,
    mesh: DeviceMesh,
    device: torch.device,
    mp_policy: Any = None,
) -> nn.Module:
    """Shard ``module`` in place following ``options`` and return it.

    A model the user already sharded in ``configure_model`` (its root is an ``FSDPModule``) is
    left as it is; parameters still on the meta device are materialized either way.
    """
    if isinstance(module, FSDPModule):
        materialize(module, device, options.param_init_fn)
        scale_float8_weights(module, options)
        return module
    if options.sync_module_states:
        broadcast_module_states(module)
    if options.activation_checkpointing_policy is not None:
        apply_activation_checkpointing(module, options.activation_checkpointing_policy)

    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "offload_policy": offload_policy_for(options, device),
        **options.fully_shard_kwargs,
    }
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    blocks = [
        block
        for block in selected_modules(module, options.auto_wrap_policy, default_blocks)
        if not isinstance(block, FSDPModule) and not _inside_sharded(block, module)
    ]
    # fully_shard groups the parameters not yet claimed by a sharded submodule: innermost first.
    for block in reversed(blocks):
        fully_shard(block, reshard_after_forward=options.reshard_after_forward, **kwargs)
    # The root's parameters are needed first in backward: keeping them unsharded after forward
    # saves one all-gather, as FSDP2 does by default for the root.
    fully_shard(module, reshard_after_forward=False, **kwargs)

    sharded = [block for block in blocks if isinstance(block, FSDPModule)]
    if options.forward_prefetch:
        for current, following in itertools.pairwise(sharded):
            current.set_modules_to_forward_prefetch([following])
    # Offloaded shards live in host memory from the start (FSDP2 refuses them anywhere else); buffers, which FSDP2
    # does not manage, stay where the model computes.
    if isinstance(kwargs["offload_policy"], CPUOffloadPolicy):
        materialize(module, torch.device("cpu"), options.param_init_fn)
        move_buffers(module, device)
    else:
        materialize(module, device, options.param_init_fn)
    scale_float8_weights(module, options)
    return module


def scale_float8_weights(module: nn.Module, options: ShardingOptions, methods: tuple[str, ...] = ("forward",)) -> None:
    """Float8 gathers take their scales computed ahead before each call of ``methods`` (float8.py), but of offloaded
    weights: FSDP2 gathers those from a copy on the accelerator, which does not carry the scale, and the computation
    would reduce host tensors over the accelerator's process group."""
    if not isinstance(options.offload_policy, CPUOffloadPolicy):
        scale_float8_weights_before(module, methods)


def _inside_sharded(block: nn.Module, root: nn.Module) -> bool:
    """True if one of the block's ancestors below the root was sharded by the user already."""
    return any(
        module is not root
        and module is not block
        and isinstance(module, FSDPModule)
        and any(child is block for child in module.modules())
        for module in root.modules()
    )


def offload_policy_for(options: ShardingOptions, device: torch.device) -> Any:
    """Pinned host memory only exists next to an accelerator; on CPU the offload keeps plain memory."""
    policy = options.offload_policy
    if isinstance(policy, CPUOffloadPolicy) and device.type == "cpu" and policy.pin_memory:
        return dataclasses.replace(policy, pin_memory=False)
    return policy


def broadcast_module_states(module: nn.Module) -> None:
    """FSDP1's sync_module_states: every process starts from rank 0's parameters and buffers."""
    if not dist.is_available() or not dist.is_initialized():
        return
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.is_meta:
                continue  # nothing to send: it is materialized (identically) after sharding
            dist.broadcast(tensor.data, src=0)


def apply_activation_checkpointing(module: nn.Module, policy: Any) -> None:
    """Recompute the selected blocks' activations in backward (composable ``checkpoint``, FSDP2-safe)."""
    from torch.distributed._composable import checkpoint

    for block in selected_modules(module, policy, default=None):
        checkpoint(block)


def materialize(module: nn.Module, device: torch.device, param_init_fn: Any = None) -> None:
    """Allocate the tensors created on the meta device (already sharded: each process allocates its shard only),
    initialize them with ``param_init_fn`` or as their construction would have (``hugging_face.initialize``), and
    read the weights of models built by ``from_pretrained`` into each process's shards from their files."""
    initializers = [
        submodule
        for submodule in module.modules()
        if any(tensor.is_meta for tensor in (*submodule.parameters(recurse=False), *submodule.buffers(recurse=False)))
    ]
    for submodule in initializers:
        submodule.to_empty(device=device, recurse=False)
    with torch.no_grad():
        if initializers and param_init_fn is not None:
            for submodule in initializers:
                param_init_fn(submodule)
        elif initializers:
            _refuse_uninitializable(module, initializers)
            with _draws_per_shard(module, device):
                initialize(module, initializers)
        load_pending(module, _read_local_shard)


def _refuse_uninitializable(root: nn.Module, initializers: list[nn.Module]) -> None:
    """Every module built on the meta device needs a way to get values: its own reset_parameters, or the
    initialization of the transformers model or LoRA adapter it belongs to."""
    covered = {id(module) for model in hugging_face_models(root) for module in model.modules()}
    for submodule in initializers:
        if id(submodule) in covered or callable(getattr(submodule, "reset_parameters", None)):
            continue
        if callable(getattr(submodule, "reset_lora_parameters", None)):
            continue
        raise RuntimeError(
            f"{type(submodule).__name__} was created on the meta device (configure_model builds there) but has no "
            "reset_parameters() to initialize it. Give it one; or create it in the LightningModule's __init__, "
            "where it is built for real; or pass param_init_fn=<callable(module)>, which then initializes every "
            "module built in configure_model (transformers' own initialization included)."
        )


@contextlib.contextmanager
def _draws_per_shard(module: nn.Module, device: torch.device) -> Iterator[None]:
    """Random values drawn on the host come from each process's generator (DTensor keeps one generator in step
    across processes only on accelerators): seeded here so that processes holding the same shard (replicas) draw the
    same values and processes holding different shards draw different ones."""
    meshes = {tensor.device_mesh for tensor in module.parameters() if hasattr(tensor, "device_mesh")}
    if device.type != "cpu" or len(meshes) != 1 or not dist.is_initialized():
        yield
        return
    (mesh,) = meshes
    seed = [int(torch.randint(0, 2**31 - 1, ()).item())]
    dist.broadcast_object_list(seed, src=0)
    # The shard a process holds is its coordinate along the mesh's shard dimension (MESH_DIM_NAMES; a mesh given
    # without names shards along its last).
    names = mesh.mesh_dim_names or ()
    shard = mesh.get_local_rank(names.index("shard") if "shard" in names else mesh.ndim - 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed[0] + shard)
        yield


def _read_local_shard(tensor: Any, weights: PretrainedWeights, original: str) -> None:
    """Copy this process's shard of a pretrained weight from its file, reading only that shard's bytes."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(tensor, DTensor):
        tensor.copy_(weights.read(original))
        return
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    local = tensor.to_local()
    value = weights.read(original, tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True)))
    if tuple(value.shape) != tuple(local.shape):
        raise RuntimeError(
            f"{original}: read a shard of shape {list(value.shape)} for a local shard of {list(local.shape)}"
        )
    local.copy_(value)


# torch's warning for a state-dict value copied into a meta-device parameter, which keeps nothing.
NO_OP_LOAD = r"for .*: copying from a non-meta parameter in the checkpoint to a meta parameter"


@contextlib.contextmanager
def refuse_loads_into_meta(strategy: str) -> Iterator[None]:
    """``load_state_dict`` into a model built on the meta device keeps nothing (torch only warns): refuse it with
    what works instead, rather than train from random weights."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=NO_OP_LOAD)
        try:
            yield
        except UserWarning as warning:
            if not re.match(NO_OP_LOAD, str(warning)):
                raise
            raise RuntimeError(
                f"configure_model loaded weights into parameters on the meta device, which keeps none of them "
                f"({str(warning).split(':')[0].removeprefix('for ')}, ...): {strategy} builds the model on the meta "
                "device and allocates each shard in setup. Load a transformers model with from_pretrained (read into "
                "the shards); other weights with Trainer.fit(ckpt_path=...), or after setup with "
                "torch.distributed.checkpoint.state_dict.set_model_state_dict(model, state_dict, "
                "options=StateDictOptions(full_state_dict=True))."
            ) from warning


def set_gradient_sync(module: nn.Module, enabled: bool) -> None:
    """Skip (or resume) the gradient reduce-scatter, for gradient accumulation without communication."""
    for submodule in module.modules():
        if isinstance(submodule, FSDPModule):
            submodule.set_requires_gradient_sync(enabled, recurse=False)
