"""Every name resolves to this package's classes in a fresh interpreter, with no import of ours."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import clean_environment

from lightning_strategies.testing import assert_install_hints_match, assert_layout_identified_only_through
from lightning_strategies_deepspeed.plugin import NAMES

DISTRIBUTION = "lightning-strategies-deepspeed"

PROBE = """
import json, sys
names = json.loads(sys.argv[1])
found = {}
import lightning, pytorch_lightning
for name in names:
    trainer = lightning.Trainer(strategy=name, accelerator="cpu", devices=1, logger=False)
    standalone = pytorch_lightning.Trainer(strategy=name, accelerator="cpu", devices=1, logger=False)
    fabric = lightning.Fabric(strategy=name, accelerator="cpu", devices=1)
    found[name] = [
        type(trainer.strategy).__module__ + ":" + type(trainer.strategy).__name__,
        isinstance(standalone.strategy, pytorch_lightning.strategies.Strategy),
        type(standalone.strategy).__name__,
        type(fabric._strategy).__module__ + ":" + type(fabric._strategy).__name__,
        trainer.strategy.config.get("zero_optimization", {}).get("stage"),
    ]
print(json.dumps(found))
"""


def test_names_resolve_in_fresh_interpreter():
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(NAMES))], capture_output=True, text=True, env=clean_environment()
    )
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(found) == set(NAMES)
    for name, (trainer_class, standalone_ok, standalone_class, fabric_class, stage) in found.items():
        assert trainer_class == "lightning_strategies_deepspeed.strategy:DeepSpeedStrategy", name
        assert standalone_ok and standalone_class == "DeepSpeedStrategy", name
        assert fabric_class == "lightning_strategies_deepspeed.fabric:DeepSpeedFabricStrategy", name
        assert stage == NAMES[name][1].get("stage", 2), name


def test_listing_imports_nothing_heavy():
    code = (
        "import sys; from lightning_strategies import get_registry; "
        "names = [entry.name for entry in get_registry() if entry.name.startswith('deepspeed')]; "
        "print(len(names), any(m in sys.modules for m in ('torch', 'deepspeed', 'lightning')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_environment())
    assert result.stdout.split() == ["7", "False"], result.stderr


def test_strategy_construction_does_not_import_deepspeed():
    """deepspeed must be imported only once the device is known (it fixes its accelerator on import)."""
    code = (
        "import sys; import lightning; t = lightning.Trainer(strategy='deepspeed_stage_3', accelerator='cpu', "
        "devices=1, logger=False); print('deepspeed' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_environment())
    assert result.stdout.strip().splitlines()[-1] == "False", result.stderr[-3000:]


def test_fabric_strategy_imports_no_trainer_module():
    """Fabric users need not load the Trainer strategy. ``import lightning.fabric`` itself imports part of
    lightning.pytorch (the ``lightning`` package's ``__init__`` does), so the check is that ours adds none."""
    code = (
        "import json, sys; import lightning.fabric; "
        "before = {m for m in sys.modules if m.startswith('lightning.pytorch')}; "
        "import lightning_strategies_deepspeed.fabric; "
        "added = sorted(m for m in sys.modules if m.startswith('lightning.pytorch') and m not in before); "
        "ours = sorted(m for m in sys.modules if m.startswith('lightning_strategies_deepspeed.')); "
        "print(json.dumps({'added': added, 'ours': ours}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_environment())
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["added"] == []
    assert "lightning_strategies_deepspeed.fabric" in loaded["ours"]
    # The Trainer strategy and its precision plugin (which subclasses lightning.pytorch's Precision).
    assert "lightning_strategies_deepspeed.strategy" not in loaded["ours"]
    assert "lightning_strategies_deepspeed.precision" not in loaded["ours"]


@pytest.mark.parametrize("accelerator", ["mps", "tpu"])
def test_unsupported_accelerator_is_refused_before_import(accelerator):
    from lightning_strategies import CapabilityError, get_registry

    with pytest.raises(CapabilityError, match="supported: cpu, cuda"):
        get_registry().entry("deepspeed").check_capabilities(accelerator=accelerator)


def test_info_gives_every_parameter_its_meaning(capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_strategies.cli import main
    from lightning_strategies.describe import parameter_docs
    from lightning_strategies_deepspeed.plugin import PARAMETERS

    for target in (
        "lightning_strategies_deepspeed.strategy:DeepSpeedStrategy",
        "lightning_strategies_deepspeed.fabric:DeepSpeedFabricStrategy",
    ):
        documented = parameter_docs(target)
        assert documented and {parameter.name for parameter in documented} <= set(PARAMETERS), target
    assert main(["info", "deepspeed_stage_3"]) == 0
    lines = capsys.readouterr().out.split("  parameters:\n")[1].splitlines()
    assert "    stage=3" in lines[0::2]
    assert all(line.startswith("        ") and line.strip() for line in lines[1::2])


def test_doctor_reports_libaio_and_the_kernel_build_tools_as_deepspeeds_needs() -> None:
    import ctypes.util
    import shutil

    from lightning_strategies_deepspeed.plugin import environment_checks

    checks = {what: (ok, detail) for what, ok, detail in environment_checks()}
    assert set(checks) == {
        "libaio (deepspeed NVMe offload)",
        "C++ compiler (deepspeed JIT kernels)",
        "ninja (deepspeed JIT kernels)",
        "nvcc (deepspeed CUDA kernels)",
    }
    ok, detail = checks["libaio (deepspeed NVMe offload)"]
    assert ok is (ctypes.util.find_library("aio") is not None)
    assert ok or "apt-get install libaio-dev" in detail
    ok, detail = checks["C++ compiler (deepspeed JIT kernels)"]
    assert ok is ((shutil.which("c++") or shutil.which("g++")) is not None)


def test_core_identifies_deepspeed_checkpoints_only_through_this_plugin(tmp_path) -> None:
    import torch

    from lightning_strategies.checkpoints import FILE
    from lightning_strategies_deepspeed import plugin
    from lightning_strategies_deepspeed.checkpoint_layout import DEEPSPEED

    folder = tmp_path / "deepspeed.ckpt"
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "latest").write_text("checkpoint")
    states = folder / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    torch.save({"module": {}}, states)
    paths = (folder, folder / "checkpoint", states)
    assert_layout_identified_only_through(
        plugin, "deepspeed", DISTRIBUTION, DEEPSPEED, paths, before=[None, None, FILE], not_matching=[tmp_path]
    )


def test_cores_install_hints_list_exactly_the_names_this_package_registers():
    assert_install_hints_match(DISTRIBUTION)
