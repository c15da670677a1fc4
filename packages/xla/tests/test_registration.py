"""The four names resolve to this package's classes in every Lightning flavour."""

import pytest

from lightning_strategies import get_registry
from lightning_strategies.testing import assert_install_hints_match, assert_layout_identified_only_through

DISTRIBUTION = "lightning-strategies-xla"
NAMES = ("xla", "xla_debug", "single_xla", "xla_fsdp")


def test_names_are_registered_as_builtin_replacements():
    registry = get_registry()
    for name in NAMES:
        entry = registry.entry(name)
        assert entry.replaces_builtin
        assert entry.distribution == DISTRIBUTION
    assert registry.entry("xla_debug").init_params == {"debug": True}
    assert not [problem for problem in registry.problems if "xla" in str(problem.names)]


@pytest.mark.parametrize(
    ("name", "class_name"),
    [("xla", "XLAStrategy"), ("xla_debug", "XLAStrategy"), ("single_xla", "SingleDeviceXLAStrategy")],
)
@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_trainer_registries_build_our_strategies(name, class_name, namespace):
    import importlib

    strategies = importlib.import_module(f"{namespace}.strategies")
    strategy = strategies.StrategyRegistry.get(name)
    assert type(strategy).__name__ == class_name
    assert type(strategy).__module__.endswith("lightning_strategies_xla.strategy")
    # Lightning's connector pairs XLA accelerator and precision by these base classes.
    assert isinstance(strategy, (strategies.XLAStrategy, strategies.SingleDeviceXLAStrategy))
    assert strategy.debug is (name == "xla_debug")


@pytest.mark.parametrize("name", ["xla", "single_xla", "xla_fsdp"])
def test_fabric_registry_builds_our_strategies(name):
    from lightning.fabric.strategies import STRATEGY_REGISTRY

    strategy = STRATEGY_REGISTRY.get(name)
    assert type(strategy).__module__ == "lightning_strategies_xla.fabric"


def test_trainer_xla_fsdp_says_it_is_fabric_only():
    from lightning.pytorch.strategies import StrategyRegistry

    with pytest.raises(ValueError, match=r"lightning\.Fabric only"):
        StrategyRegistry.get("xla_fsdp")


def test_wrong_parameter_types_are_named():
    from lightning_strategies_xla import SingleDeviceXLAStrategy, XLAStrategy

    with pytest.raises(TypeError, match="debug='yes'"):
        XLAStrategy(debug="yes")
    with pytest.raises(TypeError, match="sync_module_states"):
        XLAStrategy(sync_module_states=1)
    with pytest.raises(TypeError, match="device"):
        SingleDeviceXLAStrategy(device="cuda:0")


def test_unknown_precision_lists_the_choices():
    from lightning_strategies_xla import XLAPrecision

    with pytest.raises(ValueError, match="'bf16-true'"):
        XLAPrecision("bf16-mixed")


def test_xla_needs_more_than_one_device_and_says_so():
    """PJRT runs one process per device; XLAStrategy on one device points to single_xla (Lightning's rule)."""
    from lightning_strategies_xla import XLAStrategy

    strategy = XLAStrategy(parallel_devices=[__import__("torch").device("xla", 0)])
    with pytest.raises(NotImplementedError, match="SingleDeviceXLAStrategy"):
        strategy.setup_distributed()


def test_lightnings_accelerator_reports_unavailable_without_torch_xla(monkeypatch):
    """With this package installed but torch_xla missing (a GPU box), every Trainer must still build."""
    import types

    from lightning_strategies.errors import MissingBackendError
    from lightning_strategies_xla import devices
    from lightning_strategies_xla.lightning_device_count import count_devices_locally

    def missing() -> int:
        raise MissingBackendError("torch_xla is not installed")

    monkeypatch.setattr(devices, "local_device_count", missing)
    fake_module = types.SimpleNamespace(XLAAccelerator=type("XLAAccelerator", (), {}))
    count_devices_locally(fake_module)
    assert fake_module.XLAAccelerator.is_available() is False


def test_core_identifies_xla_fsdp_checkpoints_only_through_this_plugin(tmp_path):
    from lightning_strategies_xla import plugin
    from lightning_strategies_xla.checkpoint_layout import XLA_FSDP

    folder = tmp_path / "xla.ckpt"
    folder.mkdir()
    (folder / "checkpoint_rank-00000000-of-00000002.pth").write_bytes(b"x")
    assert_layout_identified_only_through(plugin, "xla", DISTRIBUTION, XLA_FSDP, [folder], not_matching=[tmp_path])


def test_cores_install_hints_list_exactly_the_names_this_package_registers():
    assert_install_hints_match(DISTRIBUTION)


@pytest.mark.parametrize("module_name", ["lightning.fabric.accelerators.xla", "lightning_fabric.accelerators.xla"])
def test_lightnings_xla_accelerator_counts_locally_once_imported(module_name):
    # The plugin finds these modules in core's table of watched modules; a fresh interpreter imports one.
    import subprocess
    import sys

    code = f"import {module_name} as xla; print(getattr(xla.XLAAccelerator, '_counts_devices_locally', False))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "True"
