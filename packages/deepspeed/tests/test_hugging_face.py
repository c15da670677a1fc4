"""Hugging Face transformers models through deepspeed_stage_3 on two CPU processes: built from a config or with
from_pretrained in configure_model (as ZeRO-3 partitions), LoRA adapters, trained, saved and exported back to a
Hugging Face folder."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import EXTRA, UNSET

from lightning_strategies.conformance import hugging_face as conformance

CASES = conformance.EVERY_CASE


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case in one launch of two processes (imports and rendezvous are paid once)."""
    folder = tmp_path_factory.mktemp("hugging-face")
    return conformance.launch("deepspeed_stage_3", folder, CASES, env=EXTRA, unset=UNSET)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_case(trained: Path, case: conformance.Case) -> None:
    assert conformance.check_results(trained, [case])[case.name] == []


def test_fabric_checkpoint_exports(tmp_path: Path) -> None:
    """``fabric.save`` of a pretrained Llama trained under ZeRO-3 exports to a folder that predicts as it did."""
    case = conformance.Case("llama", "pretrained")
    conformance.launch("deepspeed_stage_3", tmp_path, [case], face="fabric", env=EXTRA, unset=UNSET)
    assert conformance.check_fabric_results(tmp_path, [case]) == {case.name: []}


@pytest.mark.parametrize(("saved_by", "goes_on_under"), [("fsdp", "deepspeed_stage_3"), ("deepspeed_stage_3", "fsdp")])
def test_a_fine_tuned_llama_goes_on_under_the_other_strategy(tmp_path: Path, saved_by: str, goes_on_under: str) -> None:
    """Issue 29 with a model nobody here wrote: a Llama read with from_pretrained and fine-tuned under one strategy
    (its DCP or ZeRO folder saved at step 16), resumed by ckpt_path alone under the other, goes on as the first
    strategy's own resume of that folder does: the same weights, AdamW moments and steps (carried by parameter name),
    the same losses. The reference is a resume rather than an uninterrupted run: a fit resumed from what on_train_end
    saves at an epoch's last step takes that epoch's first batch once more (Lightning's loop, under ddp too)."""
    pytest.importorskip("lightning_strategies_fsdp")
    whole, half = conformance.Case("llama", "pretrained", steps=24), conformance.Case("llama", "pretrained", steps=16)
    conformance.launch(saved_by, tmp_path / "half", [half], env=EXTRA, unset=UNSET)
    saved = tmp_path / "half" / half.name / "last.ckpt"
    assert (saved / (".metadata" if saved_by == "fsdp" else "latest")).is_file()  # a DCP or a ZeRO folder
    for strategy in (saved_by, goes_on_under):
        conformance.launch(strategy, tmp_path / strategy, [whole], resume_from=saved, env=EXTRA, unset=UNSET)
    assert conformance.resumed_problems(tmp_path / saved_by, tmp_path / goes_on_under, whole, saved_step=16) == []


def test_compiled_layers_are_warned_of_under_zero3() -> None:
    """Compiled decoder layers recompile layer after layer under ZeRO-3's hooks: the user is told before training."""
    import torch
    import transformers

    from lightning_strategies_deepspeed.partitioned_models import warn_compiled_modules

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_compiled_modules(model)  # nothing compiled, nothing said
    for layer in model.model.layers:
        layer.compile()
    with pytest.warns(UserWarning, match=r"2 module\(s\) of the model are compiled \('model.layers.0' first\)"):
        warn_compiled_modules(model)
    with pytest.warns(UserWarning, match="under the fsdp names"):
        warn_compiled_modules(torch.nn.Sequential(torch.compile(torch.nn.Linear(2, 2))))
