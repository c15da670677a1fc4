"""Registers the strategy name "{{name}}" with lightning-strategies: metadata only.

The entry point in pyproject.toml points here. lightning-strategies reads this module to list,
describe and validate names, so it must stay light: no torch, no Lightning, no backend imports.
"""

from lightning_strategies import hookimpl


@hookimpl
def register_strategies(registry):
    registry.register(
        "{{name}}",  # the string users type: Trainer(strategy="{{name}}")
        "{{module}}.strategy:{{class_name}}",  # imported only when "{{name}}" is used
        description="Distributed data parallel training with {{distribution}}'s own logic",
        # Constructor arguments for this name. Register more names with other defaults
        # (e.g. "{{name}}_fp16" with fp16_gradient_communication=True) the same way.
        init_params={"fp16_gradient_communication": False},
        # Checked before anything heavy is imported, with a clear error for anything else.
        accelerators=("cpu", "cuda"),
        precisions=("32-true", "64-true", "16-mixed", "bf16-mixed"),
    )
