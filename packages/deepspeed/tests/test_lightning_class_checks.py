"""Where Lightning checks for its own DeepSpeedStrategy by class, ours gets the same treatment (issue 16).

Lightning's callbacks, trainer utilities and Fabric test ``isinstance(strategy, DeepSpeedStrategy)``; our
classes register as virtual subclasses of Lightning's. The checks that need a built engine or a launched
Fabric run in one fresh process (lightning_checks_script.py); the others run Lightning's code here.
docs/lightning-compatibility.md lists each place.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HERE, clean_environment
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_strategies_deepspeed.precision import DeepSpeedPrecision
from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy

BORING_MODEL_PARAMETERS = 32 * 2 + 2  # BoringModel is one Linear(32, 2)


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("lightning_checks") / "results.json"
    environment = {**clean_environment(), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(HERE / "lightning_checks_script.py"), str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=900)
    assert result.returncode == 0, f"the checks failed to run:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return json.loads(Path(out).read_text())


def _trainer(**arguments: Any) -> Trainer:
    return Trainer(strategy=DeepSpeedStrategy(), accelerator="cpu", devices=1, logger=False, **arguments)


def test_model_summary_counts_zero_3_partitioned_parameters(checks: dict[str, Any]) -> None:
    """callbacks/model_summary.py: Lightning's DeepSpeedSummary, which counts ds_numel; the plain summary saw 0."""
    assert checks["summary_zero_3"]["value"] == {
        "kind": "DeepSpeedSummary",
        "total_parameters": BORING_MODEL_PARAMETERS,
    }


def test_stochastic_weight_averaging_refuses_deepspeed(checks: dict[str, Any]) -> None:
    assert checks["stochastic_weight_averaging"]["error"] == (
        "MisconfigurationException: SWA does not currently support sharded models."
    )


def test_finetuning_callback_refuses_deepspeed(checks: dict[str, Any]) -> None:
    assert checks["finetuning"]["error"].startswith(
        "NotImplementedError: The Finetuning callback does not support running with the DeepSpeed strategy."
    )


def test_gradient_accumulation_scheduler_refuses_deepspeed(checks: dict[str, Any]) -> None:
    """Lightning's own refusal, at train start; ours used to raise a ValueError of its own first."""
    assert checks["accumulation_scheduler"]["error"] == (
        "RuntimeError: The `DeepSpeedStrategy` does not support `accumulate_grad_batches` changing between epochs."
    )


def test_fabric_backward_asks_which_model_with_several(checks: dict[str, Any]) -> None:
    """fabric.py backward: with two engines set up, a loss without model= is ambiguous."""
    error = checks["fabric_backward_two_models"]["error"]
    assert error.startswith("ValueError: When using multiple models + deepspeed, please provide the model")


def test_fabric_setup_optimizers_alone_is_refused(checks: dict[str, Any]) -> None:
    error = checks["fabric_setup_optimizers"]["error"]
    assert error.startswith("RuntimeError: The `DeepSpeedFabricStrategy` requires the model and optimizer(s)")


def test_fabric_sharded_model_partitions_under_zero_3(checks: dict[str, Any]) -> None:
    """fabric.py sharded_model: for a strategy that is a ``_Sharded`` (Lightning's DeepSpeed is), the deprecated
    context enters the strategy's module_sharded_context; ours, registered under Lightning's class, is one, and
    under ZeRO-3 the layer is created already partitioned."""
    from lightning.fabric.strategies.strategy import _Sharded

    from lightning_strategies_deepspeed.fabric import DeepSpeedFabricStrategy

    assert isinstance(DeepSpeedFabricStrategy(), _Sharded)
    assert checks["fabric_sharded_model_zero_3"]["value"] == {"partitioned": True, "local_numel": 0}


def test_compiled_model_is_refused_as_with_lightnings_deepspeed() -> None:
    """utilities/compile.py: DeepSpeed wraps the module in its engine; Lightning refuses compiled models there.
    Ours, built on DDPStrategy, passed that check before."""
    model = torch.compile(BoringModel(), backend="eager")
    with pytest.raises(RuntimeError, match="Using a compiled model is incompatible with the current strategy"):
        _trainer(max_steps=1).fit(model)


@pytest.mark.parametrize(("flag", "expected"), [("bf16-mixed", "bf16-mixed"), ("32-true", "32-true")])
def test_connector_precision_branch_gives_our_plugin(flag: str, expected: str) -> None:
    """connectors/accelerator_connector.py: Lightning's DeepSpeed branch builds its DeepSpeedPrecision; ours
    replaces it with its own for the same flag."""
    trainer = _trainer(precision=flag)
    assert type(trainer.strategy.precision_plugin) is DeepSpeedPrecision
    assert trainer.strategy.precision_plugin.precision == expected
    assert trainer._accelerator_connector.is_distributed


def test_fp16_mixed_on_cpu_still_falls_back_to_bf16() -> None:
    """Lightning's DeepSpeed branch returns before the connector's CPU fallback; ours applies it itself."""
    with pytest.warns(UserWarning, match="not supported on CPU"):
        trainer = _trainer(precision="16-mixed")
    assert trainer.strategy.precision_plugin.precision == "bf16-mixed"


def test_servable_module_validator_refuses_deepspeed() -> None:
    pytest.importorskip("requests", reason="Lightning's serving module imports requests")
    from lightning.pytorch.serve.servable_module_validator import ServableModuleValidator

    validator = ServableModuleValidator.__new__(ServableModuleValidator)  # its constructor only asks for fastapi
    with pytest.raises(Exception, match="DeepSpeedStrategy used by the trainer isn't supported"):
        validator.on_train_start(_trainer(), BoringModel())


def test_fabric_connector_precision_branch_gives_our_plugin() -> None:
    """fabric/connector.py: Lightning's DeepSpeed branch builds its plugin before the CPU fallback; ours replaces
    it, falling back as the generic path would."""
    from lightning.fabric import Fabric

    from lightning_strategies_deepspeed.fabric import DeepSpeedFabricPrecision, DeepSpeedFabricStrategy

    with pytest.warns(UserWarning, match="not supported on CPU"):
        fabric = Fabric(strategy=DeepSpeedFabricStrategy(), accelerator="cpu", devices=1, precision="16-mixed")
    assert type(fabric.strategy.precision) is DeepSpeedFabricPrecision
    assert fabric.strategy.precision.precision == "bf16-mixed"


@pytest.mark.parametrize("flag", ["32-true", "16-true", "bf16-true", "bf16-mixed"])
def test_throughput_monitor_reads_the_compute_dtype_as_for_lightnings_deepspeed(flag: str) -> None:
    """callbacks/throughput_monitor.py and fabric/utilities/throughput.py check for Lightning's DeepSpeedPrecision
    to find the dtype whose peak FLOPs a ThroughputMonitor divides by; ours was counted as float32 at every
    precision, so its MFU on a GPU was measured against the wrong peak."""
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.precision import DeepSpeedPrecision as LightningFabricDeepSpeedPrecision
    from lightning.fabric.utilities.throughput import _plugin_to_compute_dtype as fabric_compute_dtype
    from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype
    from lightning.pytorch.plugins.precision import DeepSpeedPrecision as LightningDeepSpeedPrecision

    from lightning_strategies_deepspeed.fabric import DeepSpeedFabricStrategy

    expected = _plugin_to_compute_dtype(LightningDeepSpeedPrecision(flag))
    assert expected == fabric_compute_dtype(LightningFabricDeepSpeedPrecision(flag))
    assert _plugin_to_compute_dtype(_trainer(precision=flag).precision_plugin) == expected
    fabric = Fabric(strategy=DeepSpeedFabricStrategy(), accelerator="cpu", devices=1, precision=flag)
    assert fabric_compute_dtype(fabric.strategy.precision) == expected


def test_fabric_init_module_creates_parameters_in_the_true_precision_as_lightnings_does() -> None:
    """What our Fabric plugin now inherits from Lightning's DeepSpeedPrecision: ``*-true`` creates tensors in
    that dtype under fabric.init_module(), as the Trainer plugin already did."""
    from lightning_strategies_deepspeed.fabric import DeepSpeedFabricPrecision

    with DeepSpeedFabricPrecision("bf16-true").module_init_context():
        assert torch.nn.Linear(2, 2).weight.dtype == torch.bfloat16
    with DeepSpeedFabricPrecision("bf16-mixed").module_init_context():
        assert torch.nn.Linear(2, 2).weight.dtype == torch.float32


@pytest.mark.parametrize("given", ["deepspeed", "deepspeed_stage_3", "instance"])
def test_mps_refuses_deepspeed_as_lightnings(given: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerator_connector.py and fabric/connector.py ``_check_config_and_set_final_flags``: where MPS is
    available, a strategy named "deepspeed..." or of the DDP family is refused before it is built."""
    from lightning.fabric import Fabric
    from lightning.fabric.accelerators.mps import MPSAccelerator as FabricMPSAccelerator
    from lightning.pytorch.accelerators import MPSAccelerator

    from lightning_strategies_deepspeed.fabric import DeepSpeedFabricStrategy

    for accelerator_class in (MPSAccelerator, FabricMPSAccelerator):
        monkeypatch.setattr(accelerator_class, "is_available", staticmethod(lambda: True))
    trainer_strategy = DeepSpeedStrategy() if given == "instance" else given
    fabric_strategy = DeepSpeedFabricStrategy() if given == "instance" else given
    with pytest.raises(ValueError, match="not supported on the MPS accelerator"):
        Trainer(strategy=trainer_strategy, accelerator="mps", devices=1)
    with pytest.raises(ValueError, match="not supported on the MPS accelerator"):
        Fabric(strategy=fabric_strategy, accelerator="mps", devices=1)


def test_base_class_checks_see_the_bases_of_lightnings_deepspeed() -> None:
    """Lightning also checks base classes: ParallelStrategy in trainer.py, loops/utilities.py and both connectors'
    MPS refusal; DDPStrategy in utilities/compile.py; SingleDeviceStrategy and DataParallelStrategy in fabric.py.
    Ours answer each as Lightning's DeepSpeed does."""
    from lightning.fabric import strategies as fabric_strategies
    from lightning.pytorch import strategies as trainer_strategies

    from lightning_strategies_deepspeed.fabric import DeepSpeedFabricStrategy

    for ours, theirs, module in (
        (DeepSpeedStrategy, trainer_strategies.DeepSpeedStrategy, trainer_strategies),
        (DeepSpeedFabricStrategy, fabric_strategies.DeepSpeedStrategy, fabric_strategies),
    ):
        for base in (module.ParallelStrategy, module.DDPStrategy, module.SingleDeviceStrategy, module.Strategy):
            assert issubclass(ours, base) == issubclass(theirs, base), (ours, base)
