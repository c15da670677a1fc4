"""``ColossalAIStrategy`` where Lightning 1.x exported it: ``lightning.pytorch.strategies`` and
``pytorch_lightning.strategies``.

Code and pages written for Lightning 1.x import the class from there. Lightning 2.3 dropped it; once
Lightning's strategies package is imported, it answers that name again with this package's class of
the same flavour, imported (with colossalai) only when the name is first used.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

NAME = "ColossalAIStrategy"
# Lightning's strategies package -> its namespace, as core's registry names it.
STRATEGY_PACKAGES = {
    "lightning.pytorch.strategies": "lightning.pytorch",
    "pytorch_lightning.strategies": "pytorch_lightning",
}


def export_from_lightning(module_name: str, module: ModuleType) -> None:
    """Let ``module`` (one of STRATEGY_PACKAGES) answer ``NAME``; any other missing name fails as before."""
    namespace = STRATEGY_PACKAGES.get(module_name)
    if namespace is None or NAME in vars(module):
        return
    previous = vars(module).get("__getattr__")

    def __getattr__(name: str) -> Any:
        if name == NAME:
            from lightning_strategies import get_registry

            strategy_class = get_registry().entry("colossalai").load_class(namespace)
            setattr(module, NAME, strategy_class)  # from now on an ordinary attribute
            return strategy_class
        if previous is not None:
            return previous(name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
