"""Names that exist whether or not their package is installed: this project's packages, and
Lightning's own built-in strategies. Used for install hints and for the built-in replacement
policy without importing Lightning; tests keep both lists honest against the real packages.
"""

from __future__ import annotations

# Lightning's seven DeepSpeed names: the deepspeed package replaces every one of them and adds none.
_DEEPSPEED_NAMES = (
    "deepspeed",
    "deepspeed_stage_1",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
    "deepspeed_stage_3_offload_nvme",
)

# distribution -> the strategy names it registers (design.md, "Names").
PROJECT_PACKAGES: dict[str, tuple[str, ...]] = {
    "lightning-strategies-colossalai-gemini": (
        "colossalai",
        "colossalai_cuda",
        "colossalai_cpu",
        "colossalai_auto",
    ),
    "lightning-strategies-deepspeed": _DEEPSPEED_NAMES,
    "lightning-strategies-fsdp": (
        "fsdp",
        "fsdp_cpu_offload",
        "fsdp_shard_grad_op",
        "fsdp_hybrid_shard",
        "fsdp_no_shard",
    ),
    "lightning-strategies-xla": ("xla", "xla_debug", "single_xla", "xla_fsdp"),
}

# Strategy names Lightning 2.6 registers itself, per entry point: the Trainer (lightning.pytorch)
# and Fabric (lightning.fabric) do not accept the same names.
_LIGHTNING_SHARED_NAMES = frozenset(
    {
        "ddp",
        "ddp_find_unused_parameters_true",
        "ddp_fork",
        "ddp_notebook",
        "ddp_spawn",
        *_DEEPSPEED_NAMES,
        "fsdp",
        "fsdp_cpu_offload",
        "single_tpu",
        "single_xla",
        "xla",
    }
)
LIGHTNING_TRAINER_NAMES: frozenset[str] = _LIGHTNING_SHARED_NAMES | {
    "ddp_find_unused_parameters_false",
    "ddp_fork_find_unused_parameters_false",
    "ddp_fork_find_unused_parameters_true",
    "ddp_notebook_find_unused_parameters_false",
    "ddp_notebook_find_unused_parameters_true",
    "ddp_spawn_find_unused_parameters_false",
    "ddp_spawn_find_unused_parameters_true",
    "single_device",
    "xla_debug",
}
LIGHTNING_FABRIC_NAMES: frozenset[str] = _LIGHTNING_SHARED_NAMES | {"deepspeed_stage_1_offload", "dp", "xla_fsdp"}
LIGHTNING_BUILTIN_NAMES: frozenset[str] = LIGHTNING_TRAINER_NAMES | LIGHTNING_FABRIC_NAMES

# The accelerators Lightning's own strategy behind a name runs on, for the built-in names this
# project's packages replace: where such a package is missing, Lightning's strategy answers the
# name, and on any other accelerator it fails only later, with advice that leads nowhere.
LIGHTNING_BUILTIN_ACCELERATORS: dict[str, tuple[str, ...]] = {
    **{name: ("cuda",) for name in LIGHTNING_BUILTIN_NAMES if name.startswith(("deepspeed", "fsdp"))},
    **{name: ("tpu",) for name in LIGHTNING_BUILTIN_NAMES if "xla" in name or "tpu" in name},
}


def lightning_builtin_entry_points(name: str) -> tuple[str, ...]:
    """The Lightning entry points ("Trainer", "Fabric") that have ``name`` built in."""
    return tuple(
        entry_point
        for entry_point, names in (("Trainer", LIGHTNING_TRAINER_NAMES), ("Fabric", LIGHTNING_FABRIC_NAMES))
        if name in names
    )


def providing_distribution(name: str) -> str | None:
    """The project distribution that registers ``name``, or None."""
    for distribution, names in PROJECT_PACKAGES.items():
        if name in names:
            return distribution
    return None
