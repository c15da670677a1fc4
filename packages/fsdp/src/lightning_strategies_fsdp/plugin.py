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


@hookimpl
def register_strategies(registry):  # type: ignore[no-untyped-def]
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
        )
