"""Each Trainer strategy and its Fabric twin are two faces of one body (body.py): their constructors agree, and the
Fabric module imports none of the Trainer's. Neither needs torch_xla: nothing is constructed."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest
import torch

from lightning_strategies.testing import check_trainer_and_fabric_agree
from lightning_strategies_xla import body, fabric, strategy


@pytest.mark.parametrize("name", ["XLAStrategy", "SingleDeviceXLAStrategy"])
def test_trainer_and_fabric_constructors_agree(name: str) -> None:
    """One constructor per strategy (body.py) serves both faces; each signature names every option, with its
    default, for LightningCLI and ``lightning-strategies info``. XLAStrategy's ``**kwargs`` are refused by name."""
    trainer_class, fabric_class = getattr(strategy, name), getattr(fabric, name)
    check_trainer_and_fabric_agree(trainer_class, fabric_class, extra_keywords="kwargs")
    assert {"debug", "precision_plugin"} <= set(inspect.signature(trainer_class).parameters)


@pytest.mark.parametrize("face", [strategy, fabric])
def test_a_wrong_call_names_the_class_the_user_called(face: object) -> None:
    """Python words these errors after the constructor's code: each face's copy carries the face's name, not the
    body's, which users never see. Both are raised while Python binds the arguments, before torch_xla is needed.
    (XLAStrategy takes ``**kwargs`` and refuses unknown ones itself, after looking for torch_xla.)"""
    single, multi = face.SingleDeviceXLAStrategy, face.XLAStrategy  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"^SingleDeviceXLAStrategy\.__init__\(\) got an unexpected keyword argument"):
        single(stag=3)
    with pytest.raises(TypeError, match=r"^XLAStrategy\.__init__\(\) got multiple values for argument 'accelerator'"):
        multi(None, accelerator=None)


def test_fabric_module_imports_no_trainer_module() -> None:
    """``import lightning.fabric`` itself imports lightning.pytorch (lightning/__init__.py imports the Trainer), so
    what a Fabric program can be spared is this package's Trainer modules: the strategies, the Trainer's precision
    plugin and accelerator."""
    code = (
        "import json, sys, lightning_strategies_xla.fabric\n"
        "print(json.dumps([name for name in sys.modules if name.startswith('lightning_strategies_xla')]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert {"lightning_strategies_xla.fabric", "lightning_strategies_xla.body"} <= loaded
    trainer_modules = {f"lightning_strategies_xla.{name}" for name in ("strategy", "precision", "accelerator")}
    assert not loaded & trainer_modules


@pytest.mark.parametrize(("device", "index"), [(None, None), (0, 0), (3, 3), (torch.device("xla", 2), 2)])
def test_both_single_device_faces_read_the_device_alike(device: object, index: int | None) -> None:
    assert body.device_index(device) == index  # type: ignore[arg-type]


@pytest.mark.parametrize("device", [torch.device("cpu"), True, "xla:0"])
def test_both_single_device_faces_refuse_a_device_that_is_not_xla(device: object) -> None:
    """Fabric's face took any torch.device's index before; both now refuse, naming what they take."""
    with pytest.raises(TypeError, match=r"must be an XLA device index or torch.device\('xla', i\)"):
        body.device_index(device)  # type: ignore[arg-type]
