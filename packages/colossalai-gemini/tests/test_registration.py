"""The four names are registered with metadata, and listing them imports no backend."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lightning_strategies.registry import get_registry
from lightning_strategies.testing import assert_install_hints_match, assert_layout_identified_only_through

DISTRIBUTION = "lightning-strategies-colossalai-gemini"
NAMES = {"colossalai": "auto", "colossalai_cuda": "cuda", "colossalai_cpu": "cpu", "colossalai_auto": "auto"}


@pytest.mark.parametrize(("name", "placement"), NAMES.items())
def test_name_metadata(name, placement):
    entry = get_registry().entry(name)
    assert entry.init_params == {"placement_policy": placement}
    assert entry.accelerators == ("cuda",)
    assert entry.precisions == ("16-mixed", "bf16-mixed")
    assert entry.optimizers == ("colossalai.nn.optimizer:HybridAdam", "colossalai.nn.optimizer:CPUAdam")
    assert entry.distribution == DISTRIBUTION


@pytest.mark.parametrize(("name", "placement"), NAMES.items())
def test_name_resolves_to_strategy_with_its_placement(name, placement):
    from lightning_strategies_colossalai.strategy import ColossalAIStrategy

    strategy = get_registry().resolve(name)
    assert type(strategy) is ColossalAIStrategy
    assert strategy.settings.placement_policy == placement


def test_listing_imports_neither_colossalai_nor_the_strategy():
    code = (
        "import sys\n"
        "from lightning_strategies.registry import get_registry\n"
        "names = get_registry().names()\n"
        "assert 'colossalai_cpu' in names, names\n"
        "heavy = ('colossalai', 'torch', 'lightning_strategies_colossalai.strategy')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_pytorch_lightning_flavour_resolves():
    import pytorch_lightning

    strategy_class = get_registry().entry("colossalai_cuda").load_class("pytorch_lightning")
    assert issubclass(strategy_class, pytorch_lightning.strategies.DDPStrategy)


def test_constructor_docstring_documents_every_parameter():
    import inspect

    from lightning_strategies_colossalai.strategy import ColossalAIStrategy

    doc = inspect.getdoc(ColossalAIStrategy.__init__)
    assert "Args:" in doc
    documented = {
        line.strip().split(":")[0]
        for line in doc.split("Args:")[1].splitlines()
        if line.startswith("    ") and not line.startswith("        ")
    }
    parameters = set(inspect.signature(ColossalAIStrategy.__init__).parameters) - {"self"}
    assert parameters <= documented, sorted(parameters - documented)


def test_doctor_reports_colossalai_which_core_cannot_see() -> None:
    # colossalai is installed with --no-deps, so it is not among this distribution's requirements.
    from importlib import metadata

    from lightning_strategies_colossalai.plugin import environment_checks

    [(what, ok, detail), *kernels] = environment_checks()
    assert what == "lightning-strategies-colossalai-gemini: colossalai"
    # HybridAdam's kernels are built on first use: the tools for it are this package's to report.
    assert [row[0] for row in kernels] == [
        "C++ compiler (colossalai JIT kernels)",
        "ninja (colossalai JIT kernels)",
        "nvcc (colossalai CUDA kernels)",
    ]
    try:
        installed = metadata.version("colossalai")
    except metadata.PackageNotFoundError:
        assert not ok and "pip install --no-deps" in detail
    else:
        assert detail.startswith(f"{installed} (tested: ")


def test_core_identifies_colossalai_checkpoints_only_through_this_plugin(tmp_path) -> None:
    from lightning_strategies_colossalai import plugin
    from lightning_strategies_colossalai.checkpoint_layout import COLOSSALAI

    folder = tmp_path / "colossalai.ckpt"
    (folder / "model").mkdir(parents=True)
    (folder / "meta.pt").write_bytes(b"x")
    (folder / "model" / "pytorch_model.bin.index.json").write_text("{}")
    assert_layout_identified_only_through(
        plugin, "colossalai", DISTRIBUTION, COLOSSALAI, [folder], not_matching=[folder / "model"]
    )


def test_cores_install_hints_list_exactly_the_names_this_package_registers():
    assert_install_hints_match(DISTRIBUTION)
