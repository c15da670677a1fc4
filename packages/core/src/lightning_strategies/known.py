"""Names that exist whether or not their package is installed: this project's packages, and
Lightning's own built-in strategies. Used for install hints and for the built-in replacement
policy without importing Lightning; tests keep both lists honest against the real packages.
"""

from __future__ import annotations

# distribution -> the strategy names it registers (design.md, "Names").
PROJECT_PACKAGES: dict[str, tuple[str, ...]] = {
    "lightning-strategies-colossalai-gemini": (
        "colossalai",
        "colossalai_cuda",
        "colossalai_cpu",
        "colossalai_auto",
    ),
    "lightning-strategies-deepspeed": (
        "deepspeed",
        "deepspeed_stage_1",
        "deepspeed_stage_2",
        "deepspeed_stage_2_offload",
        "deepspeed_stage_3",
        "deepspeed_stage_3_offload",
        "deepspeed_stage_3_offload_nvme",
    ),
    "lightning-strategies-fsdp": (
        "fsdp",
        "fsdp_cpu_offload",
        "fsdp_shard_grad_op",
        "fsdp_hybrid_shard",
        "fsdp_no_shard",
    ),
    "lightning-strategies-xla": ("xla", "xla_debug", "single_xla", "xla_fsdp"),
}

# Strategy names Lightning 2.6 registers itself, in lightning.pytorch and lightning.fabric together.
LIGHTNING_BUILTIN_NAMES: frozenset[str] = frozenset(
    {
        "ddp",
        "ddp_find_unused_parameters_false",
        "ddp_find_unused_parameters_true",
        "ddp_fork",
        "ddp_fork_find_unused_parameters_false",
        "ddp_fork_find_unused_parameters_true",
        "ddp_notebook",
        "ddp_notebook_find_unused_parameters_false",
        "ddp_notebook_find_unused_parameters_true",
        "ddp_spawn",
        "ddp_spawn_find_unused_parameters_false",
        "ddp_spawn_find_unused_parameters_true",
        "deepspeed",
        "deepspeed_stage_1",
        "deepspeed_stage_1_offload",
        "deepspeed_stage_2",
        "deepspeed_stage_2_offload",
        "deepspeed_stage_3",
        "deepspeed_stage_3_offload",
        "deepspeed_stage_3_offload_nvme",
        "dp",
        "fsdp",
        "fsdp_cpu_offload",
        "single_device",
        "single_tpu",
        "single_xla",
        "xla",
        "xla_debug",
        "xla_fsdp",
    }
)


def providing_distribution(name: str) -> str | None:
    """The project distribution that registers ``name``, or None."""
    for distribution, names in PROJECT_PACKAGES.items():
        if name in names:
            return distribution
    return None
