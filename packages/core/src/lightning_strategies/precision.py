"""Keeping a strategy's own precision plugin through Lightning's accelerator connector.

Lightning 2.6 builds a default precision plugin from the Trainer's ``precision`` flag and assigns
it to the strategy, replacing any plugin the strategy was registered or constructed with. A
strategy that mixes in ``OwnPrecisionMixin`` (before its Lightning base class) keeps the plugin
it was given, and turns Lightning's stock defaults into its own plugin class for the same flag.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "OwnPrecisionMixin",
    "fp16_mixed_on_cpu_as_bf16",
    "is_stock_precision",
]

# Modules whose precision classes are Lightning's stock defaults, in every Lightning flavour.
_STOCK_PRECISION_MODULES = (
    "lightning.pytorch.plugins.precision.",
    "pytorch_lightning.plugins.precision.",
    "lightning.fabric.plugins.precision.",
    "lightning_fabric.plugins.precision.",
)


def is_stock_precision(plugin: Any) -> bool:
    """True for a precision plugin of one of Lightning's own classes (not a user subclass)."""
    return type(plugin).__module__.startswith(_STOCK_PRECISION_MODULES)


class OwnPrecisionMixin:
    """Precision handling for strategies with precision plugins of their own.

    Subclasses implement ``own_precision_plugin(precision)``, returning their plugin for a
    Lightning precision flag such as ``"bf16-mixed"``, or None to accept Lightning's plugin.
    """

    _precision_plugin: Any
    _own_precision_given: bool = False

    def __init__(self, *args: Any, precision_plugin: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, precision_plugin=precision_plugin, **kwargs)  # type: ignore[call-arg]
        self._own_precision_given = precision_plugin is not None

    def own_precision_plugin(self, precision: str) -> Any:
        raise NotImplementedError

    @property
    def precision_plugin(self) -> Any:
        return super().precision_plugin  # type: ignore[misc]

    @precision_plugin.setter
    def precision_plugin(self, plugin: Any) -> None:
        if self._own_precision_given and self._precision_plugin is not None:
            return  # the plugin the strategy was constructed with wins over Lightning's default
        if plugin is not None and is_stock_precision(plugin):
            plugin = self.own_precision_plugin(str(getattr(plugin, "precision", "32-true"))) or plugin
        self._precision_plugin = plugin


def fp16_mixed_on_cpu_as_bf16(precision: str, on_cpu: bool) -> str:
    """The precision a strategy seen as Lightning's DeepSpeed or FSDP strategy should use for a flag.

    Lightning's connector turns ``"16-mixed"`` on CPU into ``"bf16-mixed"`` (fp16 autocast is not
    supported there), but only after its DeepSpeed and FSDP branches, which return first. Our
    strategies are seen as those (docs/lightning-compatibility.md), so they apply the fallback
    themselves and train on CPU as they did under the connector's generic path.
    """
    if precision == "16-mixed" and on_cpu:
        from lightning.fabric.utilities.rank_zero import rank_zero_warn

        rank_zero_warn(
            "precision='16-mixed' asks for fp16 autocast, which is not supported on CPU: using 'bf16-mixed'. "
            "Pass precision='bf16-mixed' to silence this, or train on CUDA for fp16.",
        )
        return "bf16-mixed"
    return precision
