"""Real training on PJRT's CPU device: the conformance suite, half precision, and torch_xla's warnings."""

import warnings

import pytest
import torch
from conftest import small_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_strategies.conformance.suite import ConformanceSuite, SuiteOptions
from lightning_strategies_xla import XLAAccelerator


def test_conformance_suite_single_xla(tmp_path):
    """fit, validate, test, predict, checkpoint round trip and resume equality (core's conformance kit)."""
    options = SuiteOptions(strategy="single_xla", accelerator=XLAAccelerator(), devices=1, workdir=str(tmp_path))
    results = ConformanceSuite(options).run()
    report = "\n".join(f"{result.check}: {result.passed} {result.detail}" for result in results)
    checks = {result.check for result in results}
    assert {"fit", "validate", "test", "predict", "checkpoint round trip", "resume equality"} <= checks, report
    assert all(result.passed for result in results), report


def test_reliability_tier_single_xla(tmp_path):
    """Saves killed by SIGKILL inside and between saves, and resumes equal to an uninterrupted run
    (core's reliability tier: short runs in fresh processes on the PJRT CPU device, about 75 s)."""
    from lightning_strategies.conformance import run_check

    report = run_check("single_xla", accelerator="tpu", devices=1, workdir=tmp_path, tiers=("reliability",))
    assert report.passed, str(report)


def test_bf16_true_trains_in_bfloat16_without_xla_use_bf16(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_USE_BF16", raising=False)
    model = BoringModel()
    trainer = small_trainer(tmp_path, precision="bf16-true")
    assert type(trainer.precision_plugin).__module__ == "lightning_strategies_xla.precision"
    trainer.fit(model)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    # Lightning's stock plugin sets XLA_USE_BF16, which torch_xla 2.9 deprecates; ours removed it.
    assert "XLA_USE_BF16" not in __import__("os").environ


def test_training_raises_no_torch_xla_deprecation(tmp_path):
    model = BoringModel()
    trainer = small_trainer(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model)
        trainer.save_checkpoint(tmp_path / "model.ckpt")
        trainer.validate(model, verbose=False)
        trainer.predict(model)
    deprecations = [
        str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and "xla" in str(w.message).lower()
    ]
    assert deprecations == []


def test_checkpoint_is_written_with_cpu_tensors_and_resumes_to_the_same_weights(tmp_path):
    torch.manual_seed(0)
    model = BoringModel()
    trainer = small_trainer(tmp_path)
    trainer.fit(model)
    path = tmp_path / "after-fit.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, map_location="cpu", weights_only=False)
    assert {tensor.device.type for tensor in saved["state_dict"].values()} == {"cpu"}

    restored = BoringModel()
    small_trainer(tmp_path, max_epochs=1).validate(restored, ckpt_path=path, verbose=False)
    for name, tensor in restored.state_dict().items():
        assert torch.equal(tensor.cpu(), saved["state_dict"][name]), name


def test_debug_sets_the_current_variable_only_while_running(tmp_path, monkeypatch):
    import os

    monkeypatch.delenv("PT_XLA_DEBUG_LEVEL", raising=False)
    seen = {}

    class Probe(BoringModel):
        def on_train_start(self):
            seen["level"] = os.environ.get("PT_XLA_DEBUG_LEVEL")
            seen["old"] = os.environ.get("PT_XLA_DEBUG")

    from lightning_strategies_xla import SingleDeviceXLAStrategy

    small_trainer(tmp_path, strategy=SingleDeviceXLAStrategy(debug=True), max_steps=1).fit(Probe())
    assert seen == {"level": "2", "old": None}
    assert "PT_XLA_DEBUG_LEVEL" not in os.environ


@pytest.mark.tpu
def test_conformance_on_every_tpu_core(tmp_path):
    """On a TPU VM: xla over all cores (collectives included), then single_xla, via the CLI's suite."""
    from lightning_strategies.conformance import run_check

    cores = XLAAccelerator.auto_device_count()
    for name, devices in (("xla", cores), ("single_xla", 1), ("xla", cores)):
        report = run_check(name, accelerator="tpu", devices=devices, workdir=tmp_path / f"{name}-{devices}")
        assert report.passed, str(report)
    bf16 = run_check("xla", accelerator="tpu", devices=cores, precision="bf16-true", workdir=tmp_path / "bf16")
    assert bf16.passed, str(bf16)


def test_check_command_passes_for_single_xla_on_pjrt_cpu():
    """`lightning-strategies check single_xla --accelerator tpu --devices 1`, as a user runs it."""
    from lightning_strategies.cli import main

    assert main(["check", "single_xla", "--accelerator", "tpu", "--devices", "1"]) == 0
