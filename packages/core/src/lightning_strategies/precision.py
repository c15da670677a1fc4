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
