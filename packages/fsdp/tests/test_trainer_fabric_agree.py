"""The Trainer and the Fabric strategy are two faces of one body (body.py): their constructors must agree, and the
Fabric face must not drag the Trainer's modules in."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from lightning_strategies.testing import check_trainer_and_fabric_agree
from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy
from lightning_strategies_fsdp.strategy import FSDP2Strategy


def test_trainer_and_fabric_constructors_agree() -> None:
    """One constructor (body.py) serves both; each face's signature names every option, with its default, for
    LightningCLI and ``lightning-strategies info``. ``**kwargs`` is what goes on to ``fully_shard``."""
    check_trainer_and_fabric_agree(FSDP2Strategy, FSDP2FabricStrategy, extra_keywords="kwargs")
    assert len(inspect.signature(FSDP2Strategy).parameters) > 15  # the FSDP parameters themselves


@pytest.mark.parametrize("strategy_class", [FSDP2Strategy, FSDP2FabricStrategy])
def test_a_wrong_call_names_the_class_the_user_called(strategy_class: type) -> None:
    """Python words these errors after the constructor's code: each face's copy carries the face's name, not the
    body's, which users never see. (A misspelt keyword lands in ``**kwargs`` and is refused by parse_options.)"""
    face = strategy_class.__qualname__
    with pytest.raises(TypeError, match=rf"^{face}\.__init__\(\) got multiple values for argument 'accelerator'"):
        strategy_class(None, accelerator=None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'stag'") as refused:
        strategy_class(stag=3)
    assert "Body" not in str(refused.value)


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
