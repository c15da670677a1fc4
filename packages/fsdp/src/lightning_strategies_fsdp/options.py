"""The FSDP1 constructor parameters users know, translated into FSDP2 (``fully_shard``) settings.

Lightning's FSDPStrategy takes FSDP1 arguments (``sharding_strategy``, ``cpu_offload``,
``MixedPrecision``, ``BackwardPrefetch`` ...). FSDP2 expresses the same ideas differently: a
device mesh and ``reshard_after_forward`` instead of a sharding strategy, policies instead of
configs. Both the Trainer and the Fabric strategy validate and translate here, so the two
accept exactly the same values with the same messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_deprecation
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from typing_extensions import override

from lightning_strategies import check_choice, check_type, warn_obsolete_parameter

STRATEGY = "FSDPStrategy"

# The types the parameters take: Lightning's FSDPStrategy annotations, plus the FSDP2 forms this package also reads,
# so that LightningCLI (jsonargparse) reads a command line or a YAML file into the objects Lightning's class gets.
WrapPolicy = set[type[nn.Module]] | Callable[[nn.Module, bool, int], bool] | ModuleWrapPolicy
ShardingStrategyName = (
    ShardingStrategy | Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"]
)
BackwardPrefetchName = BackwardPrefetch | Literal["BACKWARD_PRE", "BACKWARD_POST"]
CpuOffload = bool | CPUOffload | OffloadPolicy
MixedPrecisionSettings = MixedPrecision | MixedPrecisionPolicy | dict[str, Any]
DeviceMeshShape = tuple[int, int] | DeviceMesh
StateDictType = Literal["sharded", "full"]
ModuleClasses = type[nn.Module] | list[type[nn.Module]]

# FSDP1 sharding strategies, and what each means on FSDP2: (mesh layout, reshard after forward).
# "1d" shards over every process; "hybrid" replicates across nodes and shards inside a node;
# "replicate" keeps a full copy per process (a 2-D mesh whose shard dimension has size 1).
SHARDING_STRATEGIES: dict[str, tuple[str, bool]] = {
    "FULL_SHARD": ("1d", True),
    "SHARD_GRAD_OP": ("1d", False),
    "NO_SHARD": ("replicate", False),
    "HYBRID_SHARD": ("hybrid", True),
    "_HYBRID_SHARD_ZERO2": ("hybrid", False),
}
BACKWARD_PREFETCH = (None, "BACKWARD_PRE", "BACKWARD_POST")
STATE_DICT_TYPES = ("sharded", "full")


class ShardingStrategyError(ValueError, KeyError):
    """An unknown sharding strategy: a KeyError, as Lightning's FSDPStrategy raises looking the name up in FSDP1's
    ShardingStrategy, and a ValueError, as ours raised before."""

    @override
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclasses.dataclass(frozen=True)
class ShardingOptions:
    """Everything ``fully_shard`` and the strategies need, validated once at construction."""

    sharding_strategy: str = "FULL_SHARD"
    auto_wrap_policy: Any = None
    activation_checkpointing_policy: Any = None
    offload_policy: OffloadPolicy = dataclasses.field(default_factory=OffloadPolicy)
    mp_policy: MixedPrecisionPolicy | None = None
    backward_prefetch: str | None = None
    forward_prefetch: bool = False
    param_init_fn: Callable[[nn.Module], None] | None = None
    sync_module_states: bool = False
    device_mesh: Any = None
    fully_shard_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def mesh_layout(self) -> str:
        return SHARDING_STRATEGIES[self.sharding_strategy][0]

    @property
    def reshard_after_forward(self) -> bool:
        return SHARDING_STRATEGIES[self.sharding_strategy][1]


def parse_options(
    *,
    auto_wrap_policy: Any,
    activation_checkpointing: Any,
    activation_checkpointing_policy: Any,
    cpu_offload: Any,
    mixed_precision: Any,
    sharding_strategy: Any,
    backward_prefetch: Any,
    forward_prefetch: bool,
    limit_all_gathers: bool,
    use_orig_params: bool,
    param_init_fn: Callable[[nn.Module], None] | None,
    sync_module_states: bool,
    device_mesh: Any,
    **extra: Any,
) -> ShardingOptions:
    """Validate the FSDP1-style arguments and return their FSDP2 meaning.

    Every argument is required: the defaults are the strategies' constructor's (body.py), kept in that one place.
    """
    if limit_all_gathers is not True:
        warn_obsolete_parameter(
            STRATEGY,
            "limit_all_gathers",
            limit_all_gathers,
            "FSDP2 has no all-gather rate limiter; it frees memory through stream-ordered allocation, so "
            "all-gathers never run more than one module ahead unless you ask for prefetching (forward_prefetch).",
        )
    if use_orig_params is not True:
        warn_obsolete_parameter(
            STRATEGY,
            "use_orig_params",
            use_orig_params,
            "FSDP2 always keeps the original parameters (as sharded DTensors), so optimizers, parameter "
            "groups and frozen parameters work as they do without sharding.",
        )
    check_type(STRATEGY, "forward_prefetch", forward_prefetch, bool)
    check_type(STRATEGY, "sync_module_states", sync_module_states, bool)
    if param_init_fn is not None and not callable(param_init_fn):
        raise TypeError(
            f"{STRATEGY}(param_init_fn={param_init_fn!r}) must be a callable taking a module, "
            f"not {type(param_init_fn).__name__}."
        )
    check_policy("auto_wrap_policy", auto_wrap_policy)
    activation_checkpointing_policy = parse_activation_checkpointing(
        activation_checkpointing, activation_checkpointing_policy
    )
    check_policy("activation_checkpointing_policy", activation_checkpointing_policy)
    return ShardingOptions(
        sharding_strategy=parse_sharding_strategy(sharding_strategy),
        auto_wrap_policy=auto_wrap_policy,
        activation_checkpointing_policy=activation_checkpointing_policy,
        offload_policy=parse_cpu_offload(cpu_offload),
        mp_policy=parse_mixed_precision(mixed_precision),
        backward_prefetch=parse_backward_prefetch(backward_prefetch),
        forward_prefetch=forward_prefetch,
        param_init_fn=param_init_fn,
        sync_module_states=sync_module_states,
        device_mesh=parse_device_mesh(device_mesh),
        fully_shard_kwargs=parse_extra(extra),
    )


def _enum_name(value: Any) -> Any:
    """FSDP1 enums (ShardingStrategy.FULL_SHARD) and strings ("full_shard") compare by name."""
    if isinstance(value, str):
        return value.upper()
    return getattr(value, "name", value)


def parse_sharding_strategy(value: Any) -> str:
    name = _enum_name(value)
    if name not in SHARDING_STRATEGIES:
        # Lightning's message is the name it looked up, quoted as a KeyError quotes it.
        lightnings = f"{name!r}: " if isinstance(value, str) else ""
        choices = ", ".join(repr(choice) for choice in SHARDING_STRATEGIES)
        raise ShardingStrategyError(
            f"{lightnings}{STRATEGY}(sharding_strategy={value!r}) is not valid. Choose one of: {choices}."
        )
    return str(name)


def parse_backward_prefetch(value: Any) -> str | None:
    name = check_choice(STRATEGY, "backward_prefetch", _enum_name(value), BACKWARD_PREFETCH)
    # FSDP2 has no such setting: whatever is asked, it prefetches as BACKWARD_PRE did.
    if name == "BACKWARD_PRE":
        warn_obsolete_parameter(
            STRATEGY,
            "backward_prefetch",
            value,
            "FSDP2 always issues the next module's all-gather before the current module's gradient computation, "
            "which is what BACKWARD_PRE asked for; remove the argument.",
        )
    elif name == "BACKWARD_POST":
        warn_obsolete_parameter(
            STRATEGY,
            "backward_prefetch",
            value,
            "FSDP2 issues the next module's all-gather before the current module's gradient computation "
            "(what BACKWARD_PRE did), which overlaps at least as well; BACKWARD_POST is treated as BACKWARD_PRE.",
        )
    return name


def parse_cpu_offload(value: Any) -> OffloadPolicy:
    """``True``, FSDP1's ``CPUOffload(offload_params=...)`` or an FSDP2 ``OffloadPolicy``."""
    if isinstance(value, OffloadPolicy):
        return value
    if isinstance(value, bool):
        return CPUOffloadPolicy() if value else OffloadPolicy()
    offload_params = getattr(value, "offload_params", None)
    if isinstance(offload_params, bool):  # torch.distributed.fsdp.CPUOffload (FSDP1)
        return CPUOffloadPolicy() if offload_params else OffloadPolicy()
    raise TypeError(
        f"{STRATEGY}(cpu_offload={value!r}) must be a bool, torch.distributed.fsdp.CPUOffload or "
        f"torch.distributed.fsdp.CPUOffloadPolicy, not {type(value).__name__}."
    )


_FSDP1_MIXED_PRECISION_IGNORED = {
    "buffer_dtype": "FSDP2 does not manage buffers; they keep the dtype the module gives them "
    "(use precision='bf16-true' or cast the buffers in configure_model).",
    "keep_low_precision_grads": "FSDP2 reduces gradients in reduce_dtype and stores them in the dtype of the "
    "sharded parameters.",
    "cast_root_forward_inputs": "FSDP2 casts forward inputs of every sharded module when cast_forward_inputs=True.",
    "_module_classes_to_ignore": "FSDP2 applies one policy per fully_shard call; shard such modules separately.",
}


def parse_mixed_precision(value: Any) -> MixedPrecisionPolicy | None:
    """An FSDP2 ``MixedPrecisionPolicy``, FSDP1's ``MixedPrecision`` or a dict of policy fields."""
    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    if isinstance(value, dict):
        allowed = [field.name for field in dataclasses.fields(MixedPrecisionPolicy)]
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ValueError(
                f"{STRATEGY}(mixed_precision={value!r}) has unknown keys {unknown}. Allowed: {', '.join(allowed)}."
            )
        return MixedPrecisionPolicy(**{name: _dtype_named(name, given) for name, given in value.items()})
    if dataclasses.is_dataclass(value) and hasattr(value, "param_dtype") and hasattr(value, "buffer_dtype"):
        defaults = {field.name: field.default for field in dataclasses.fields(value)}
        for name, reason in _FSDP1_MIXED_PRECISION_IGNORED.items():
            if name in defaults and getattr(value, name) != defaults[name]:
                warn_obsolete_parameter(STRATEGY, f"mixed_precision.{name}", getattr(value, name), reason)
        fsdp1_policy: Any = value  # FSDP1's MixedPrecision, recognised by its fields rather than imported
        return MixedPrecisionPolicy(
            param_dtype=fsdp1_policy.param_dtype,
            reduce_dtype=fsdp1_policy.reduce_dtype,
            cast_forward_inputs=True,
        )
    raise TypeError(
        f"{STRATEGY}(mixed_precision={value!r}) must be a torch.distributed.fsdp.MixedPrecisionPolicy, "
        f"a torch.distributed.fsdp.MixedPrecision or a dict, not {type(value).__name__}."
    )


def _dtype_named(field: str, given: Any) -> Any:
    """A policy field's value, with a dtype given by name ("bfloat16", as a YAML config or ``--options`` writes it)
    read as the torch dtype."""
    if not (field.endswith("_dtype") and isinstance(given, str)):
        return given
    dtype = getattr(torch, given.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"{STRATEGY}(mixed_precision={{{field!r}: {given!r}}}): {given!r} is not a torch dtype. "
            "Give a name such as 'bfloat16', 'float16' or 'float32'."
        )
    return dtype


def parse_device_mesh(value: Any) -> Any:
    """A (replicas, shard size) tuple for hybrid sharding, or a ready DeviceMesh."""
    if value is None:
        return None
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(value, DeviceMesh):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(n, int) and n > 0 for n in value):
        return tuple(value)
    raise TypeError(
        f"{STRATEGY}(device_mesh={value!r}) must be a (number of replicas, shard group size) tuple of "
        "positive ints or a torch.distributed.device_mesh.DeviceMesh."
    )


def parse_activation_checkpointing(classes: Any, policy: Any) -> Any:
    """Lightning's deprecated ``activation_checkpointing`` (module classes) as the policy it stands for, in Lightning's
    words."""
    if classes is None:
        return policy
    if policy is not None:
        raise ValueError(
            "You cannot set both `activation_checkpointing` and `activation_checkpointing_policy`. Use the latter."
        )
    kinds = set(classes) if isinstance(classes, list) else {classes}
    rank_zero_deprecation(
        f"`{STRATEGY}(activation_checkpointing={classes})` is deprecated, use "
        f"`{STRATEGY}(activation_checkpointing_policy={kinds})` instead."
    )
    return kinds


def check_policy(parameter: str, policy: Any) -> None:
    if policy is None or callable(policy):
        return
    if isinstance(policy, (set, frozenset, list, tuple)) and all(isinstance(kind, type) for kind in policy):
        return
    raise TypeError(
        f"{STRATEGY}({parameter}={policy!r}) must be a set of nn.Module classes (for example "
        "{MyTransformerBlock}), a torch.distributed.fsdp.wrap policy such as ModuleWrapPolicy, or a "
        "callable (module, recurse, nonwrapped_numel) -> bool."
    )


# fully_shard arguments users may pass through, and FSDP1 constructor arguments with no FSDP2 meaning.
_PASS_THROUGH = ("shard_placement_fn", "ignored_params")
_FSDP1_ONLY = {
    "device_id": "the strategy places each process on its own device.",
    "ignored_states": "pass ignored_params (a set of parameters) instead.",
    "ignored_modules": "pass ignored_params (the parameters of those modules) instead.",
    "process_group": "pass device_mesh instead.",
}


def parse_extra(extra: dict[str, Any]) -> dict[str, Any]:
    passed = {}
    for name, value in extra.items():
        if name in _PASS_THROUGH:
            passed[name] = value
        elif name in _FSDP1_ONLY:
            warn_obsolete_parameter(STRATEGY, name, value, _FSDP1_ONLY[name])
        else:
            allowed = ", ".join((*_PASS_THROUGH, *_FSDP1_ONLY))
            raise TypeError(
                f"{STRATEGY}() got an unexpected keyword argument {name!r}. Besides its named parameters it "
                f"accepts: {allowed}."
            )
    return passed


def mesh_shape(options: ShardingOptions, world_size: int, num_nodes: int) -> tuple[int, ...]:
    """The device mesh for the sharding strategy: 1-D (shard) or 2-D (replicate, shard)."""
    layout = options.mesh_layout
    if layout == "1d":
        return (world_size,)
    if layout == "replicate":
        return (world_size, 1)
    shape = options.device_mesh if isinstance(options.device_mesh, tuple) else (num_nodes, world_size // num_nodes)
    if shape[0] * shape[1] != world_size:
        raise ValueError(
            f"{STRATEGY}(sharding_strategy={options.sharding_strategy!r}, device_mesh={shape}) needs "
            f"replicas x shard size = world size, but {shape[0]} x {shape[1]} != {world_size}. "
            f"Pass device_mesh=(replicas, shard size) with a product of {world_size}."
        )
    return shape


def mixed_precision_for(precision: str) -> MixedPrecisionPolicy | None:
    """FSDP2's mixed precision for Lightning's "-mixed" flags: compute in low precision on all-gathered
    copies, keep the fp32 shards as master weights for the optimizer, reduce gradients in fp32."""
    low = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    if low is None:
        return None
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
