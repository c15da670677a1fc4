"""Registers the DeepSpeed strategy names with lightning-strategies (imports nothing heavy)."""

from lightning_strategies import hookimpl

_TRAINER = "lightning_strategies_deepspeed.strategy:DeepSpeedStrategy"
_FABRIC = "lightning_strategies_deepspeed.fabric:DeepSpeedFabricStrategy"
_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")

# name -> (description, constructor defaults); the same names as Lightning's built-ins.
NAMES = {
    "deepspeed": ("DeepSpeed, ZeRO stage 2 by default", {}),
    "deepspeed_stage_1": ("DeepSpeed ZeRO stage 1: optimizer states partitioned", {"stage": 1}),
    "deepspeed_stage_2": ("DeepSpeed ZeRO stage 2: optimizer states and gradients partitioned", {"stage": 2}),
    "deepspeed_stage_2_offload": (
        "DeepSpeed ZeRO stage 2 with the optimizer offloaded to CPU",
        {"stage": 2, "offload_optimizer": True},
    ),
    "deepspeed_stage_3": (
        "DeepSpeed ZeRO stage 3: parameters, gradients and optimizer states partitioned",
        {"stage": 3},
    ),
    "deepspeed_stage_3_offload": (
        "DeepSpeed ZeRO stage 3 with optimizer and parameters offloaded to CPU",
        {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
    ),
    "deepspeed_stage_3_offload_nvme": (
        "DeepSpeed ZeRO stage 3 with optimizer and parameters offloaded to NVMe (needs libaio)",
        {
            "stage": 3,
            "offload_optimizer": True,
            "offload_parameters": True,
            "remote_device": "nvme",
            "offload_params_device": "nvme",
            "offload_optimizer_device": "nvme",
        },
    ),
}


@hookimpl
def register_strategies(registry):
    for name, (description, init_params) in NAMES.items():
        registry.register(
            name,
            _TRAINER,
            description=description,
            init_params=init_params,
            accelerators=("cpu", "cuda"),
            precisions=_PRECISIONS,
            gradient_accumulation=True,
            fabric_target=_FABRIC,
            replaces_builtin=True,
            pip_name="lightning-strategies-deepspeed",
        )
