"""Where Lightning checks for its own FSDPStrategy by class, ours gets the same treatment (issue 16).

The Trainer strategy registers as a virtual subclass of Lightning's FSDPStrategy. The Fabric strategy does
not: Fabric's one FSDP check refuses an optimizer made before a meta-device model is set up, which ours
supports. Checks that need a process group run in one fresh process (scripts/lightning_checks.py); the
others run Lightning's code here. docs/lightning-compatibility.md lists each place.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loops.utilities import _no_grad_context
from lightning.pytorch.plugins.precision import HalfPrecision, Precision

from lightning_strategies.conformance.launching import fresh_launch_environment
from lightning_strategies_fsdp.precision import FSDP2BF16MixedPrecision, FSDP2HalfPrecision, FSDP2Precision
from lightning_strategies_fsdp.strategy import FSDP2Strategy

SCRIPT = Path(__file__).parent / "scripts" / "lightning_checks.py"


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("lightning_checks") / "results.json"
    environment = fresh_launch_environment({"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, env=environment, timeout=400
    )
    assert result.returncode == 0, f"the checks failed to run:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return json.loads(out.read_text())


def _trainer(**arguments: Any) -> Trainer:
    return Trainer(strategy=FSDP2Strategy(), accelerator="cpu", devices=1, logger=False, **arguments)


def test_evaluation_loops_use_no_grad_instead_of_inference_mode() -> None:
    """loops/utilities.py _no_grad_context: FSDP's unshard records tensor versions, which inference tensors lack.
    Run where no gloo group exists, so only the strategy's class decides (gloo gets no_grad anyway)."""
    trainer = _trainer()
    seen = {}

    def run(loop: Any) -> None:
        seen.update(inference_mode=torch.is_inference_mode_enabled(), grad=torch.is_grad_enabled())

    for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
        assert loop.inference_mode  # the Trainer's default asks for inference_mode
        _no_grad_context(run)(loop)
        assert seen == {"inference_mode": False, "grad": False}


def test_stochastic_weight_averaging_refuses_fsdp(checks: dict[str, Any]) -> None:
    assert checks["stochastic_weight_averaging"]["error"] == (
        "MisconfigurationException: SWA does not currently support sharded models."
    )


def test_compiled_model_is_accepted_and_trains(checks: dict[str, Any]) -> None:
    """utilities/compile.py: Lightning accepts compiled models with its FSDP; ours was refused as a
    ParallelStrategy."""
    assert checks["compiled_model"]["value"] == {"global_step": 2, "weights_changed": True}


def test_fabric_sets_up_a_meta_device_model_with_its_optimizer(checks: dict[str, Any]) -> None:
    """fabric.py _validate_setup: deliberately not honoured. Lightning refuses (FSDP1 cannot rebind the
    optimizer); ours rebinds it to the materialized shards, so the Fabric strategy stays unregistered."""
    assert checks["fabric_meta_device_setup"]["value"] == {"materialized": True, "stepped": True}


@pytest.mark.parametrize(
    ("flag", "plugin"),
    [("32-true", FSDP2Precision), ("bf16-true", FSDP2HalfPrecision), ("bf16-mixed", FSDP2BF16MixedPrecision)],
)
def test_connector_precision_branch_gives_fsdp2_plugins(flag: str, plugin: type) -> None:
    """connectors/accelerator_connector.py: Lightning's FSDP branch builds FSDP1's FSDPPrecision (which refuses
    gradient clipping by norm); ours turns it into the plugin that serves FSDP2, which clips shard by shard."""
    trainer = _trainer(precision=flag)
    assert type(trainer.strategy.precision_plugin) is plugin
    assert isinstance(trainer.strategy.precision_plugin, (Precision, HalfPrecision))
    assert trainer._accelerator_connector.is_distributed


def test_fp16_mixed_on_cpu_still_falls_back_to_bf16() -> None:
    """Lightning's FSDP branch returns before the connector's CPU fallback; ours applies it itself."""
    with pytest.warns(UserWarning, match="not supported on CPU"):
        trainer = _trainer(precision="16-mixed")
    assert type(trainer.strategy.precision_plugin) is FSDP2BF16MixedPrecision


def test_servable_module_validator_refuses_fsdp() -> None:
    pytest.importorskip("requests", reason="Lightning's serving module imports requests")
    from lightning.pytorch.serve.servable_module_validator import ServableModuleValidator

    validator = ServableModuleValidator.__new__(ServableModuleValidator)  # its constructor only asks for fastapi
    with pytest.raises(Exception, match="FSDP2Strategy used by the trainer isn't supported"):
        validator.on_train_start(_trainer(), BoringModel())


@pytest.mark.parametrize("flag", ["32-true", "16-true", "bf16-true", "bf16-mixed"])
def test_throughput_monitor_reads_the_compute_dtype_lightnings_fsdp_plugin_gives(flag: str) -> None:
    """callbacks/throughput_monitor.py and fabric/utilities/throughput.py check for Lightning's FSDPPrecision
    and read its reduce dtype; our plugins are not FSDPPrecision, so the monitor reads them by their generic
    class, which must name the same dtype (the one whose peak FLOPs MFU is measured against)."""
    import warnings

    from lightning.fabric import Fabric
    from lightning.fabric.utilities.throughput import _plugin_to_compute_dtype as fabric_compute_dtype
    from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype
    from lightning.pytorch.plugins.precision import FSDPPrecision

    from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP1's plugin warns that "*-true" computes in lower precision
        expected = _plugin_to_compute_dtype(FSDPPrecision(flag))  # type: ignore[arg-type]
        fabric = Fabric(strategy=FSDP2FabricStrategy(), accelerator="cpu", devices=1, precision=flag)
    assert _plugin_to_compute_dtype(_trainer(precision=flag).precision_plugin) == expected
    assert fabric_compute_dtype(fabric.strategy.precision) == expected


@pytest.mark.parametrize("given", ["fsdp", "fsdp_shard_grad_op", "instance"])
def test_mps_is_refused_as_with_lightnings_fsdp(given: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerator_connector.py ``_check_strategy_and_fallback`` refuses Lightning's FSDP off CUDA, and both
    connectors' ``_check_config_and_set_final_flags`` refuse parallel strategies where MPS is available; core
    lifts the first for our names on CPU, so on MPS ours must still be refused (the names by their registered
    accelerators, an instance as a ParallelStrategy)."""
    from lightning.fabric import Fabric
    from lightning.fabric.accelerators.mps import MPSAccelerator as FabricMPSAccelerator
    from lightning.pytorch.accelerators import MPSAccelerator

    from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy

    for accelerator_class in (MPSAccelerator, FabricMPSAccelerator):
        monkeypatch.setattr(accelerator_class, "is_available", staticmethod(lambda: True))
    trainer_strategy = FSDP2Strategy() if given == "instance" else given
    fabric_strategy = FSDP2FabricStrategy() if given == "instance" else given
    with pytest.raises(ValueError, match=r"(?i)mps"):
        Trainer(strategy=trainer_strategy, accelerator="mps", devices=1)
    with pytest.raises(ValueError, match="MPS"):
        Fabric(strategy=fabric_strategy, accelerator="mps", devices=1)


def test_fabric_sharded_model_is_no_fsdp1_wrapping_context() -> None:
    """fabric.py sharded_model (deprecated): for a ``_Sharded`` strategy it enters module_sharded_context, which
    for Lightning's FSDP is FSDP1's ``enable_wrap``. FSDP2 has no such context (an intended difference,
    docs/lightning-compatibility.md): ours is no ``_Sharded``, so the context is empty and models are sharded
    by fabric.setup, as with fabric.init_module."""
    from lightning.fabric.strategies.strategy import _Sharded

    from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy

    assert not isinstance(FSDP2FabricStrategy(), _Sharded)
    assert not hasattr(FSDP2FabricStrategy(), "module_sharded_context")


def test_base_class_checks_see_the_bases_of_lightnings_fsdp() -> None:
    """Lightning also checks base classes: ParallelStrategy in trainer.py (barrier and broadcast of the run's
    paths), loops/utilities.py and both connectors' MPS refusal; SingleDeviceStrategy and DataParallelStrategy in
    fabric.py (no launch needed, no_backward_sync). Ours answer each as Lightning's FSDP does, save Fabric's
    ``_Sharded`` (test_fabric_sharded_model_is_no_fsdp1_wrapping_context)."""
    from lightning.fabric import strategies as fabric_strategies
    from lightning.pytorch import strategies as trainer_strategies

    from lightning_strategies_fsdp.fabric import FSDP2FabricStrategy

    for ours, theirs, module in (
        (FSDP2Strategy, trainer_strategies.FSDPStrategy, trainer_strategies),
        (FSDP2FabricStrategy, fabric_strategies.FSDPStrategy, fabric_strategies),
    ):
        for base in (module.ParallelStrategy, module.DDPStrategy, module.SingleDeviceStrategy, module.Strategy):
            assert issubclass(ours, base) == issubclass(theirs, base), (ours, base)
    assert not issubclass(FSDP2FabricStrategy, fabric_strategies.DataParallelStrategy)
