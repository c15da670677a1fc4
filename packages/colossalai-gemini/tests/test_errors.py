"""Refusals that must happen before anything heavy: no CUDA, wrong precision, wrong optimizer."""

from __future__ import annotations

import types

import lightning as L
import pytest
import torch

from lightning_strategies.errors import CapabilityError, MissingBackendError
from lightning_strategies_colossalai import backend
from lightning_strategies_colossalai.strategy import ColossalAIStrategy


@pytest.mark.parametrize("name", ["colossalai", "colossalai_cuda", "colossalai_cpu", "colossalai_auto"])
def test_name_on_cpu_accelerator_is_refused_before_import(name):
    with pytest.raises(CapabilityError, match=r"accelerator='cpu' is not supported \(supported: cuda\)"):
        L.Trainer(strategy=name, accelerator="cpu", precision="bf16-mixed", logger=False)


def test_instance_on_cpu_accelerator_asks_for_a_cuda_gpu():
    strategy = ColossalAIStrategy(placement_policy="cuda")
    with pytest.raises(CapabilityError, match=r"needs a CUDA GPU.*accelerator='cuda'"):
        L.Trainer(strategy=strategy, accelerator="cpu", precision="bf16-mixed", logger=False)


def test_cpu_placement_on_cpu_accelerator_says_cpu_is_the_offload_target_and_a_gpu_is_still_needed():
    strategy = ColossalAIStrategy(placement_policy="cpu")
    with pytest.raises(CapabilityError, match=r"CPU memory is the offload target.*still runs on the GPU"):
        L.Trainer(strategy=strategy, accelerator="cpu", precision="bf16-mixed", logger=False)


def test_fp32_is_refused_with_the_precisions_to_use():
    with pytest.raises(ValueError, match=r"precision='16-mixed' or precision='bf16-mixed'"):
        ColossalAIStrategy(placement_policy="cuda").own_precision_plugin("32-true")


def test_auto_placement_takes_bf16_and_fp16():
    assert ColossalAIStrategy(placement_policy="auto").own_precision_plugin("bf16-mixed").gemini_precision == "bf16"
    assert ColossalAIStrategy(placement_policy="auto").own_precision_plugin("16-mixed").gemini_precision == "fp16"
    assert ColossalAIStrategy(placement_policy="cuda").own_precision_plugin("bf16-mixed").gemini_precision == "bf16"


def test_optimizer_other_than_hybrid_or_cpu_adam_is_refused():
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(TypeError, match=r"HybridAdam, colossalai.nn.optimizer.CPUAdam.*torch.optim.adamw.AdamW"):
        ColossalAIStrategy.check_optimizers([adamw])


def test_exactly_one_optimizer():
    from colossalai.nn.optimizer import HybridAdam

    # Real HybridAdam instances without __init__: building one compiles its kernels (minutes on CPU).
    one = HybridAdam.__new__(HybridAdam)
    ColossalAIStrategy.check_optimizers([one])
    with pytest.raises(ValueError, match=r"exactly one optimizer.*returned 2"):
        ColossalAIStrategy.check_optimizers([one, HybridAdam.__new__(HybridAdam)])


def _trainer_settings(clip, algorithm="norm"):
    return types.SimpleNamespace(gradient_clip_val=clip, gradient_clip_algorithm=algorithm)


def test_clipping_by_value_is_refused():
    strategy = ColossalAIStrategy(placement_policy="cuda")
    strategy.precision_plugin = strategy.own_precision_plugin("16-mixed")
    with pytest.raises(CapabilityError, match=r"by norm only"):
        strategy._check_clipping(_trainer_settings(1.0, "value"))
    strategy._check_clipping(_trainer_settings(1.0))


@pytest.mark.parametrize("placement", ["cpu", "auto", "static"])
def test_bf16_clipping_with_cpu_held_optimizer_is_refused(placement):
    offload = {"offload_optim_frac": 0.4} if placement == "static" else {}
    strategy = ColossalAIStrategy(placement_policy=placement, **offload)
    strategy.precision_plugin = strategy.own_precision_plugin("16-mixed")
    strategy._check_clipping(_trainer_settings(1.0))  # fp16: the CPU kernel applies the clipping scale
    if placement != "auto":
        strategy.precision_plugin = strategy.own_precision_plugin("bf16-mixed")
        with pytest.raises(CapabilityError, match=r"ignores the clipping scale"):
            strategy._check_clipping(_trainer_settings(1.0))


def test_colossalai_out_of_range_names_the_install_line(monkeypatch):
    monkeypatch.setattr("lightning_strategies.backends.installed_version", lambda distribution: "0.4.6")
    with pytest.raises(MissingBackendError, match=r"colossalai 0.4.6 is installed.*pip install --no-deps"):
        backend.load_colossalai()


def test_colossalai_loads_on_current_torch():
    assert backend.load_colossalai().__version__.startswith("0.5.")


def test_stochastic_weight_averaging_is_refused_as_for_lightnings_sharded_strategies():
    """Lightning's SWA callback refuses its DeepSpeed and FSDP strategies by class; Gemini refuses it itself."""
    from lightning.pytorch.callbacks import StochasticWeightAveraging
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    trainer = types.SimpleNamespace(callbacks=[StochasticWeightAveraging(swa_lrs=0.1)])
    expected = r"SWA does not currently support sharded models\. .*holds in shards .* Remove the callback"
    with pytest.raises(MisconfigurationException, match=expected):
        ColossalAIStrategy.refuse_weight_averaging(trainer)
    ColossalAIStrategy.refuse_weight_averaging(types.SimpleNamespace(callbacks=[]))
