"""Registers the FSDP2 strategy names (metadata only: no torch, no Lightning imported here)."""

from __future__ import annotations

from lightning_strategies import hookimpl

TRAINER_TARGET = "lightning_strategies_fsdp.strategy:FSDP2Strategy"
FABRIC_TARGET = "lightning_strategies_fsdp.fabric:FSDP2FabricStrategy"
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")

# name -> (description, constructor defaults, replaces a Lightning built-in name)
NAMES: dict[str, tuple[str, dict[str, object], bool]] = {
    "fsdp": ("FSDP2 (fully_shard): parameters, gradients and optimizer states sharded", {}, True),
    "fsdp_cpu_offload": (
        "FSDP2 with parameters, gradients and optimizer states offloaded to host memory",
        {"cpu_offload": True},
        True,
    ),
    "fsdp_shard_grad_op": (
        "FSDP2 keeping parameters gathered between forward and backward (ZeRO-2 style)",
        {"sharding_strategy": "SHARD_GRAD_OP"},
        False,
    ),
    "fsdp_hybrid_shard": (
        "FSDP2 on a 2-D mesh: sharded within a node, replicated across nodes",
        {"sharding_strategy": "HYBRID_SHARD"},
        False,
    ),
    "fsdp_no_shard": (
        "FSDP2 with full replicas per process (data parallel through FSDP's hooks)",
        {"sharding_strategy": "NO_SHARD"},
        False,
    ),
}

# What each constructor parameter means, for `lightning-strategies info`. "FSDP1:" marks a parameter of
# Lightning's FSDP1 strategy and says what it becomes on FSDP2 (options.py does the mapping).
PARAMETERS: dict[str, str] = {
    "accelerator": "The accelerator: CPU (gloo) or CUDA (NCCL); set by the Trainer or Fabric.",
    "parallel_devices": "The devices to train on, one process each; set by the Trainer or Fabric.",
    "cluster_environment": "The cluster environment; set by the Trainer or Fabric.",
    "checkpoint_io": "Checkpoint IO plugin; DCP checkpoints are written by the strategy itself.",
    "precision_plugin": "Precision plugin; by default the one for the Trainer's precision flag.",
    "precision": "Fabric's precision plugin; by default the one for Fabric's precision flag.",
    "process_group_backend": "Process group backend: by default gloo on CPU, NCCL on CUDA.",
    "timeout": "Timeout of collective operations.",
    "auto_wrap_policy": "FSDP1: which modules become their own FSDP unit. On FSDP2: the modules given their own "
    "fully_shard call: a set of module classes, a torch.distributed.fsdp.wrap policy or an FSDP1-style "
    "callable. None: the repeated blocks of each ModuleList or Sequential.",
    "cpu_offload": "FSDP1: CPUOffload or a bool. On FSDP2: CPUOffloadPolicy, which keeps parameters, gradients "
    "and optimizer states in host memory; an FSDP2 OffloadPolicy is accepted as is.",
    "mixed_precision": "FSDP1: MixedPrecision. On FSDP2: MixedPrecisionPolicy (param_dtype, reduce_dtype); "
    "buffer_dtype and keep_low_precision_grads have no FSDP2 meaning and warn. A policy or a dict of its fields "
    "is accepted as is. None: follows the precision flag.",
    "sharding_strategy": "FSDP1: ShardingStrategy. On FSDP2: FULL_SHARD = 1-D mesh, reshard_after_forward=True; "
    "SHARD_GRAD_OP = 1-D mesh, reshard_after_forward=False; NO_SHARD = replicas on a (world, 1) mesh; "
    "HYBRID_SHARD = (replicas, shard) mesh, sharded within a node.",
    "backward_prefetch": "FSDP1: BackwardPrefetch. No effect on FSDP2, which always all-gathers the next module "
    "before the current one's backward (what BACKWARD_PRE did); a value other than None warns.",
    "forward_prefetch": "FSDP1: forward_prefetch. On FSDP2: each block all-gathers the next block in forward "
    "order ahead of time (set_modules_to_forward_prefetch).",
    "limit_all_gathers": "FSDP1: the all-gather rate limiter. No effect on FSDP2, which orders memory through "
    "its streams; False warns.",
    "use_orig_params": "FSDP1: use_orig_params. No effect on FSDP2, which always keeps the original parameters "
    "(as sharded DTensors); False warns.",
    "param_init_fn": "FSDP1: param_init_fn. On FSDP2: called on each module built on the meta device to "
    "initialize its materialized parameters; None: the module's reset_parameters.",
    "sync_module_states": "FSDP1: sync_module_states. On FSDP2: every process starts from rank 0's parameters "
    "and buffers, broadcast after sharding.",
    "activation_checkpointing": "Deprecated in Lightning: module classes whose activations are recomputed in "
    "backward; warns and becomes activation_checkpointing_policy={those classes}.",
    "activation_checkpointing_policy": "Which modules recompute their activations in backward: a set of module "
    "classes or a wrap policy.",
    "device_mesh": "(replicas, shard size) for HYBRID_SHARD, or a ready DeviceMesh; FSDP1's process_group "
    "becomes this.",
    "state_dict_type": "'sharded': checkpoints are DCP folders, one shard per process; 'full': one file with "
    "the whole state. Either loads onto any number of processes.",
    "shard_placement_fn": "Passed to fully_shard: which dimension of each parameter is sharded.",
    "ignored_params": "Passed to fully_shard: parameters left unsharded and unmanaged (FSDP1's ignored_states "
    "and ignored_modules become this).",
}


@hookimpl
def register_strategies(registry):
    for name, (description, init_params, replaces_builtin) in NAMES.items():
        registry.register(
            name,
            TRAINER_TARGET,
            description=description,
            init_params=init_params,
            accelerators=("cpu", "cuda"),
            precisions=PRECISIONS,
            gradient_accumulation=True,
            fabric_target=FABRIC_TARGET,
            replaces_builtin=replaces_builtin,
            parameters=PARAMETERS,
        )


@hookimpl
def memory_plan_candidates(workload, machine):
    from lightning_strategies_fsdp.memory import candidates

    return candidates(workload, machine)


@hookimpl
def checkpoint_formats():
    from lightning_strategies_fsdp.checkpoint_layout import DCP

    return [DCP]
