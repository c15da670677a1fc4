"""Modules built in model_sharded_context stay lazy until materialised (real ColossalAI, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_strategies.testing import run_script
from lightning_strategies_colossalai.strategy import ColossalAIStrategy


def test_configure_model_context_creates_lazy_parameters_that_materialise():
    from colossalai.lazy import LazyInitContext
    from colossalai.lazy.lazy_init import LazyTensor

    strategy = ColossalAIStrategy(placement_policy="cuda", parallel_devices=[torch.device("cpu")])
    torch.manual_seed(0)
    with strategy.tensor_init_context(), strategy.model_sharded_context():
        module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    assert all(isinstance(parameter, LazyTensor) for parameter in module.parameters())

    LazyInitContext.materialize(module)
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    for lazy_parameter, eager_parameter in zip(module.parameters(), eager.parameters(), strict=True):
        assert not isinstance(lazy_parameter, LazyTensor)
        torch.testing.assert_close(lazy_parameter.detach(), eager_parameter.detach())


# Hugging Face transformers models, built lazily as the strategy builds them in configure_model (real ColossalAI
# and transformers on CPU; GeminiDDP, which materialises them on the GPU, runs in the GPU tier).

transformers = pytest.importorskip("transformers")
conformance = pytest.importorskip("lightning_strategies.conformance.hugging_face")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pretrained")
    for family in conformance.FAMILIES:
        conformance.write_pretrained(folder, family)
    return folder


def built_lazily(family: str, source: Path | None) -> torch.nn.Module:
    """What configure_model builds under the strategy, materialised as GeminiDDP materialises each parameter."""
    from colossalai.lazy import LazyInitContext

    from lightning_strategies_colossalai.lazy_init import read_pretrained_when_built

    strategy = ColossalAIStrategy(placement_policy="cuda", parallel_devices=[torch.device("cpu")])
    with strategy.tensor_init_context(), strategy.model_sharded_context():
        if family == "bert":
            model = (
                transformers.BertForSequenceClassification(conformance.tiny_config("bert"))
                if source is None
                else transformers.BertForSequenceClassification.from_pretrained(source / family, num_labels=2)
            )
        elif source is None:
            model = transformers.AutoModelForCausalLM.from_config(conformance.tiny_config(family))
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(source / family)
    read_pretrained_when_built(model)
    return LazyInitContext.materialize(model)


@pytest.mark.parametrize("family", conformance.FAMILIES)
def test_transformers_models_from_a_config_get_hugging_face_initialisation(family: str) -> None:
    """Rotary and position buffers set with copy_ (a RecursionError in ColossalAI's lazy tensors as they are)."""
    model = built_lazily(family, None)
    reference = conformance.eager_model(family).state_dict()
    assert conformance.initialisation_problems(model.state_dict(), reference) == []


@pytest.mark.parametrize("family", conformance.FAMILIES)
def test_from_pretrained_weights_are_read_as_parameters_materialise(family: str, pretrained: Path) -> None:
    model = built_lazily(family, pretrained)
    reference = conformance.eager_model(family, pretrained / family).state_dict()
    loaded = model.state_dict()
    new_head = {name for name in reference if family == "bert" and name.startswith("classifier.")}
    assert [name for name in reference if name not in new_head and not torch.equal(loaded[name], reference[name])] == []
    assert (
        conformance.initialisation_problems(
            {name: loaded[name] for name in new_head}, {name: reference[name] for name in new_head}
        )
        == []
    )


def test_transformers_imported_inside_configure_model_builds() -> None:
    """The seed example with its import inside the hook: a module whose annotations read ``torch.LongTensor |
    None`` is imported while the legacy constructors are lazy (a TypeError in ColossalAI's context as it is)."""
    code = (
        "import torch, sys\n"
        "from lightning_strategies_colossalai.strategy import ColossalAIStrategy\n"
        "assert 'transformers.models.bert.modeling_bert' not in sys.modules\n"
        "strategy = ColossalAIStrategy(parallel_devices=[torch.device('cpu')])\n"
        "with strategy.model_sharded_context():\n"
        "    from transformers import BertConfig, BertForSequenceClassification\n"
        "    model = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,\n"
        "                                                     num_attention_heads=2, intermediate_size=64))\n"
        "assert torch.LongTensor.__module__ == 'torch' and isinstance(torch.LongTensor, type)\n"
        "print('built', type(model).__name__)\n"
    )
    assert "built BertForSequenceClassification" in run_script("-c", code).stdout


def test_lora_models_are_refused_with_the_reason() -> None:
    peft = pytest.importorskip("peft")
    from lightning_strategies import CapabilityError
    from lightning_strategies_colossalai.refusals import check_adapters

    model = transformers.AutoModelForCausalLM.from_config(conformance.tiny_config("llama"))
    check_adapters(model)  # a plain model trains
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj"]))
    with pytest.raises(CapabilityError, match=r"support_lora\(\) is False.*fsdp.*deepspeed_stage_3"):
        check_adapters(adapted)
