"""Registers the XLA strategy names; imports nothing heavy (no torch, no torch_xla)."""

from lightning_strategies import hookimpl, watched_modules

# lightning.fabric's and lightning_fabric's accelerators/xla.py, from core's one table of watched modules.
_LIGHTNING_XLA_ACCELERATOR_MODULES = watched_modules("xla accelerator")

_PRECISIONS = ("32-true", "bf16-true", "16-true")
# Lightning calls its XLA accelerator "tpu", whatever the PJRT device behind it.
_ACCELERATORS = ("tpu",)


@hookimpl
def register_strategies(registry):
    common = dict(accelerators=_ACCELERATORS, precisions=_PRECISIONS, replaces_builtin=True)
    registry.register(
        "xla",
        "lightning_strategies_xla.strategy:XLAStrategy",
        description="Data parallel over all XLA devices on torch_xla 2.9, one process per device",
        fabric_target="lightning_strategies_xla.fabric:XLAStrategy",
        **common,
    )
    registry.register(
        "xla_debug",
        "lightning_strategies_xla.strategy:XLAStrategy",
        description="The xla strategy with torch_xla's debug analysis on (PT_XLA_DEBUG_LEVEL)",
        init_params={"debug": True},
        fabric_target="lightning_strategies_xla.fabric:XLAStrategy",
        **common,
    )
    registry.register(
        "single_xla",
        "lightning_strategies_xla.strategy:SingleDeviceXLAStrategy",
        description="One XLA device (a TPU core, or PJRT's CPU device) on torch_xla 2.9",
        fabric_target="lightning_strategies_xla.fabric:SingleDeviceXLAStrategy",
        **common,
    )
    registry.register(
        "xla_fsdp",
        "lightning_strategies_xla.strategy:XLAFSDPStrategy",
        description="Fully sharded data parallel on XLA devices (torch_xla's FSDP); Fabric only",
        fabric_target="lightning_strategies_xla.fabric:XLAFSDPStrategy",
        **common,
    )


@hookimpl
def lightning_module_imported(module_name, module):
    # Lightning's own XLA accelerator would ask the GCE metadata server for the TPU layout.
    if module_name in _LIGHTNING_XLA_ACCELERATOR_MODULES:
        from lightning_strategies_xla.lightning_device_count import count_devices_locally

        count_devices_locally(module)


@hookimpl
def checkpoint_formats():
    from lightning_strategies_xla.checkpoint_layout import XLA_FSDP

    return [XLA_FSDP]
