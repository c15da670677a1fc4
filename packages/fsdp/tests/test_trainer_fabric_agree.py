"""The Trainer and the Fabric strategy are two faces of one body (body.py): their constructors must agree, and the
Fabric face must not drag the Trainer's modules in."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy
from lightning_strategies_fsdp.strategy import FSDP2Strategy

# Parameters that name each entry point's own classes: the Trainer's and Fabric's accelerator and precision plugin
# classes are distinct, and Lightning calls the plugin ``precision_plugin`` in one and ``precision`` in the other.
ENTRY_POINT_SPECIFIC = {"accelerator", "precision_plugin", "precision"}


def constructor(cls: type) -> list[tuple[str, object, object, object]]:
    """(name, kind, default, annotation as written) of each parameter, in order."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [(p.name, p.kind, p.default, p.annotation) for p in parameters if p.name not in ENTRY_POINT_SPECIFIC]


def test_trainer_and_fabric_constructors_agree() -> None:
    trainer, fabric = constructor(FSDP2Strategy), constructor(FSDP2FabricStrategy)
    assert trainer == fabric
    assert len(trainer) > 15  # the FSDP parameters themselves, not an empty comparison
    trainer_names = list(inspect.signature(FSDP2Strategy.__init__).parameters)
    fabric_names = list(inspect.signature(FSDP2FabricStrategy.__init__).parameters)
    assert trainer_names.index("precision_plugin") == fabric_names.index("precision")


def test_fabric_module_imports_no_trainer_module() -> None:
    """``import lightning.fabric`` itself imports lightning.pytorch (lightning/__init__.py imports the Trainer), so
    only this package's Trainer modules can be held out of a Fabric program."""
    code = (
        "import json, sys, lightning_strategies_fsdp.fabric\n"
        "print(json.dumps([name for name in sys.modules if name.startswith('lightning_strategies_fsdp')]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "lightning_strategies_fsdp.fabric" in loaded
    assert "lightning_strategies_fsdp.strategy" not in loaded
    assert "lightning_strategies_fsdp.precision" not in loaded  # the Trainer's precision plugins
