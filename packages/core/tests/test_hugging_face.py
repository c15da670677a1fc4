"""Hugging Face models in one process: from_pretrained deferred and read back, what bad input is told, export.

Real transformers models (tiny Llama and BERT), no process group: the strategies' own tests train them on several
processes (packages/fsdp, packages/deepspeed) and build them lazily (packages/colossalai-gemini).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lightning_strategies import CheckpointError  # noqa: E402
from lightning_strategies import hugging_face as hf  # noqa: E402
from lightning_strategies.cli import main as cli  # noqa: E402
from lightning_strategies.conformance import hugging_face as conformance  # noqa: E402
from lightning_strategies.hugging_face.pretrained import pending_weights  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved with save_pretrained (a few training steps into its task)."""
    return conformance.write_pretrained(tmp_path_factory.mktemp("pretrained"), "llama")


def built_deferred(source: Path, **kwargs) -> torch.nn.Module:
    """from_pretrained inside the deferred context on the meta device, then read back whole in one process."""
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_pretrained(source, **kwargs)
    model.to_empty(device="cpu")
    hf.initialize(model, list(model.modules()))
    with torch.no_grad():
        hf.load_pending(model, lambda tensor, weights, original: tensor.copy_(weights.read(original)))
    return model


def test_deferred_from_pretrained_reads_every_weight_of_the_file(saved: Path) -> None:
    model = built_deferred(saved)
    reference = transformers.AutoModelForCausalLM.from_pretrained(saved)
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert model.name_or_path == str(saved) and not model.training  # as from_pretrained returns it


def test_a_shard_reads_only_its_rows(saved: Path) -> None:
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_pretrained(saved)
    ((prefix, _, weights),) = pending_weights(model)
    assert prefix == ""  # the model is the root
    whole = weights.read("model.embed_tokens.weight")
    assert torch.equal(weights.read("model.embed_tokens.weight", (slice(32, 64),)), whole[32:64])
    assert pending_weights(model) == []  # handed out once


def test_the_patch_on_transformers_lasts_as_long_as_the_context(saved: Path) -> None:
    original = transformers.PreTrainedModel.__dict__["from_pretrained"]
    with pytest.raises(RuntimeError, match="inside"), hf.deferred_pretrained_loading("test"):
        assert transformers.PreTrainedModel.__dict__["from_pretrained"] is not original
        raise RuntimeError("inside")
    assert transformers.PreTrainedModel.__dict__["from_pretrained"] is original
    assert transformers.PreTrainedModel.__dict__["init_weights"].__qualname__ == "PreTrainedModel.init_weights"
    auto_original = transformers.AutoModelForCausalLM.__dict__["from_pretrained"]
    with hf.deferred_pretrained_loading("test"):
        assert transformers.AutoModelForCausalLM.__dict__["from_pretrained"] is not auto_original
    assert transformers.AutoModelForCausalLM.__dict__["from_pretrained"] is auto_original


@pytest.mark.parametrize("model_class", [transformers.LlamaForCausalLM, transformers.AutoModelForCausalLM])
def test_a_missing_folder_is_refused_with_what_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_class: type
) -> None:
    """Through the model's own class and through an Auto class, which looks in the folder before the first."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    refused = pytest.raises(CheckpointError, match=r"no-such-model'\): there is no such folder.*save_pretrained")
    with refused, hf.deferred_pretrained_loading("test"), torch.device("meta"):
        model_class.from_pretrained(tmp_path / "no-such-model")


def test_a_half_written_checkpoint_is_refused_before_anything_is_built(saved: Path, tmp_path: Path) -> None:
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "config.json").write_text((saved / "config.json").read_text())
    # Sharded, with the second shard never written.
    keys = json.loads(json.dumps(list(transformers.AutoModelForCausalLM.from_pretrained(saved).state_dict())))
    weight_map = {key: "model-00001-of-00002.safetensors" if i % 2 else "model-00002-of-00002.safetensors"
                  for i, key in enumerate(keys)}  # fmt: skip
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "model-00001-of-00002.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    with pytest.raises(
        CheckpointError, match=r"lists 1 file\(s\) that are not there.*model-00002.*Save the model again"
    ):
        built_deferred(folder)

    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "config.json").write_text((saved / "config.json").read_text())
    (truncated / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"cannot be read.*damaged or was not written to the end"):
        built_deferred(truncated)


def test_pickled_weights_are_refused_with_how_to_convert_them(saved: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text((saved / "config.json").read_text())
    torch.save({}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin.*save_pretrained it again"):
        built_deferred(folder)


def test_a_config_that_contradicts_the_checkpoint_is_refused_or_initialised_on_request(saved: Path) -> None:
    wider = transformers.AutoConfig.from_pretrained(saved)
    wider.vocab_size = 256
    with pytest.raises(CheckpointError, match=r"do not fit.*embed_tokens.*\[128, 64\].*ignore_mismatched_sizes=True"):
        built_deferred(saved, config=wider)
    model = built_deferred(saved, config=wider, ignore_mismatched_sizes=True)
    assert model.model.embed_tokens.weight.shape == (256, 64)
    assert 0.01 < model.model.embed_tokens.weight.std() < 0.04  # drawn as Hugging Face draws it


def test_placing_arguments_are_refused_with_the_reason(saved: Path) -> None:
    with pytest.raises(TypeError, match=r"device_map=.*the strategy places every shard"):
        built_deferred(saved, device_map="auto")


def test_export_writes_a_folder_from_pretrained_loads(saved: Path, tmp_path: Path) -> None:
    reference = transformers.AutoModelForCausalLM.from_pretrained(saved)
    checkpoint = tmp_path / "lightning.ckpt"
    # A checkpoint of Lightning's own strategies, which keep no record of the model: the config is passed.
    torch.save({"state_dict": {f"model.{k}": v for k, v in reference.state_dict().items()}}, checkpoint)
    with pytest.raises(CheckpointError, match=r"no record of a transformers model.*config="):
        hf.export(checkpoint, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    assert cli(["export", str(checkpoint), str(tmp_path / "out"), "--config", str(saved)]) == 0
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    batch = conformance.data("llama", 4, seed=1).tensors[0]
    torch.testing.assert_close(exported(input_ids=batch).logits, reference(input_ids=batch).logits)


def test_an_exported_adapter_is_named_with_how_peft_loads_it(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    peft = pytest.importorskip("peft")
    module = torch.nn.Module()
    module.model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(saved), peft.LoraConfig(r=4))
    checkpoint = {"state_dict": module.state_dict()}
    hf.record_models(checkpoint, module)
    torch.save(checkpoint, tmp_path / "lightning.ckpt")
    assert cli(["export", str(tmp_path / "lightning.ckpt"), str(tmp_path / "out")]) == 0
    assert "a PEFT adapter: load it with PeftModel.from_pretrained(base_model, " in capsys.readouterr().out
    assert (tmp_path / "out" / "adapter_config.json").is_file()


def test_export_never_writes_over_a_folder(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    checkpoint = tmp_path / "lightning.ckpt"
    torch.save({"state_dict": {}}, checkpoint)
    assert cli(["export", str(checkpoint), str(out), "--config", str(saved)]) == 2
    assert "exists already" in capsys.readouterr().err
    assert [item.name for item in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_export_of_a_missing_checkpoint_says_it_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "checkpoints" / "last.ckpt"
    assert cli(["export", str(missing), str(tmp_path / "out")]) == 2
    assert f"No checkpoint at {missing}. Check the path." in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_recorded_model_exports_without_a_config(saved: Path, tmp_path: Path) -> None:
    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.AutoModelForCausalLM.from_pretrained(saved)

    holder = Holder()
    checkpoint: dict = {"state_dict": holder.state_dict()}
    hf.record_models(checkpoint, holder)
    assert json.loads(checkpoint["hugging_face"])["model"]["class"] == "LlamaForCausalLM"
    torch.save(checkpoint, tmp_path / "recorded.ckpt")
    hf.export(tmp_path / "recorded.ckpt", tmp_path / "out")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name, value in holder.model.state_dict().items():
        assert torch.equal(exported.state_dict()[name], value), name


def materialised(model: torch.nn.Module) -> torch.nn.Module:
    """What a strategy does with a model built on the meta device, in one process."""
    modules = [m for m in model.modules() if any(t.is_meta for t in (*m.parameters(False), *m.buffers(False)))]
    for module in modules:
        module.to_empty(device="cpu", recurse=False)
    hf.initialize(model, modules)
    with torch.no_grad():
        hf.load_pending(model, lambda tensor, weights, original: tensor.copy_(weights.read(original)))
    return model


def test_a_lora_model_reads_the_weights_peft_moved_and_starts_as_its_base(saved: Path) -> None:
    """modules_to_save keeps the head under original_module and a trained copy under modules_to_save.<adapter>."""
    peft = pytest.importorskip("peft")
    settings = peft.LoraConfig(
        task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]
    )
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(saved), settings)
    materialised(model)
    base = transformers.AutoModelForCausalLM.from_pretrained(saved)
    batch = conformance.data("llama", 4, seed=1).tensors[0]
    torch.testing.assert_close(model(input_ids=batch).logits, base(input_ids=batch).logits)  # B is zero


def test_adapters_that_start_from_the_base_weights_are_refused(saved: Path) -> None:
    peft = pytest.importorskip("peft")
    from lightning_strategies import CapabilityError

    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(saved)
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(
        CapabilityError, match=r"use_dora=True computes the adapter's starting values.*init_lora_weights=True"
    ):
        materialised(model)


def test_xlora_is_refused_as_it_is_built(saved: Path, tmp_path: Path) -> None:
    """XLoRA reads its adapters' files itself while it is built, where they would be lost."""
    peft = pytest.importorskip("peft")
    from lightning_strategies import CapabilityError

    base = transformers.AutoModelForCausalLM.from_pretrained(saved)
    peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "lora")
    settings = peft.XLoraConfig(task_type="CAUSAL_LM", hidden_size=64, adapters={"0": str(tmp_path / "lora")})
    refused = pytest.raises(CapabilityError, match=r"XLoRA inside configure_model under test.*strategy='ddp'")
    with refused, hf.deferred_pretrained_loading("test"), torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_pretrained(saved, use_cache=False)
        peft.get_peft_model(model, settings)
    assert peft.XLoraModel.__init__.__module__ == "peft.tuners.xlora.model"  # put back


def test_an_adapter_folder_is_refused_with_how_to_load_it(saved: Path, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    adapted = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(saved), peft.LoraConfig(r=4))
    adapted.save_pretrained(tmp_path / "adapter")  # its config names the base model's folder
    refused = pytest.raises(
        TypeError,
        match=r"from_pretrained\('[^']*adapter'\) .*holds a PEFT adapter.*PeftModel.from_pretrained\(base_model, "
        r"adapter_folder, is_trainable=True\).*base model: '",
    )
    with refused, hf.deferred_pretrained_loading("test"), torch.device("meta"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "adapter")


def a_trained_adapter(base: Path, folder: Path, config: object = None, safe_serialization: bool = True) -> Path:
    """A LoRA adapter whose B is not zero (as a trained one's is not), saved with save_pretrained: on the model saved
    at ``base``, or on one built from ``config``."""
    peft = pytest.importorskip("peft")
    auto = transformers.AutoModelForCausalLM
    model = auto.from_pretrained(base) if config is None else auto.from_config(config)
    settings = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    adapted = peft.get_peft_model(model, settings)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                parameter.normal_(0, 0.05)
    adapted.save_pretrained(folder, safe_serialization=safe_serialization)
    return folder


def test_an_adapter_loaded_onto_its_base_in_the_hook_is_read_into_the_built_model(saved: Path, tmp_path: Path) -> None:
    """PeftModel.from_pretrained(base, folder) in configure_model: the adapter's weights reach the built model (on
    the meta device, PEFT's own load would copy them into nothing) and it predicts as PEFT's eager load does."""
    peft = pytest.importorskip("peft")
    adapter = a_trained_adapter(saved, tmp_path / "adapter")
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(saved)
        model = peft.PeftModel.from_pretrained(base, adapter, is_trainable=True)
    assert peft.PeftModel.__dict__["load_adapter"].__module__ == "peft.peft_model"  # the patch is gone
    materialised(model)
    eager = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(saved), adapter)
    built, expected = model.state_dict(), eager.state_dict()
    adapted = [name for name in expected if "lora_B" in name or "modules_to_save" in name]
    assert len(adapted) == 5 and all(torch.equal(built[name], expected[name]) for name in adapted)
    batch = conformance.data("llama", 4, seed=1).tensors[0]
    torch.testing.assert_close(model(input_ids=batch).logits, eager(input_ids=batch).logits)
    assert any(parameter.requires_grad for name, parameter in model.named_parameters() if "lora_B" in name)


def test_what_the_hook_imports_is_patched_then_and_nothing_is_imported_otherwise(saved: Path, tmp_path: Path) -> None:
    """Importing transformers' models or peft costs seconds, whatever the model: the context leaves them alone until
    a hook imports them, and patches them then."""
    pytest.importorskip("peft")
    adapter = a_trained_adapter(saved, tmp_path / "adapter")
    script = f"""
import sys, torch, transformers
from lightning_strategies import hugging_face as hf
from lightning_strategies.hugging_face.pretrained import pending_weights
with hf.deferred_pretrained_loading("test"):
    pass
assert "peft" not in sys.modules and "transformers.modeling_utils" not in sys.modules, "imported unasked"
finders = list(sys.meta_path)
with hf.deferred_pretrained_loading("test"), torch.device("meta"):
    base = transformers.AutoModelForCausalLM.from_pretrained({str(saved)!r})
    from peft import PeftModel
    PeftModel.from_pretrained(base, {str(adapter)!r}, is_trainable=True)
assert [weights.adapter for _, _, weights in pending_weights(base)] == [False, True]
assert PeftModel.__dict__["load_adapter"].__module__ == "peft.peft_model" and sys.meta_path == finders
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_nested_contexts_patch_a_module_imported_inside_both_and_unwind_in_order() -> None:
    script = """
import sys
from lightning_strategies import hugging_face as hf

def refusal():
    try:
        modeling_utils.PreTrainedModel.load_adapter(None, "folder")
    except (TypeError, AttributeError) as error:  # ours, or transformers' own on an object that is no model
        return str(error)

assert "transformers.modeling_utils" not in sys.modules
with hf.deferred_pretrained_loading("outer"):
    with hf.deferred_pretrained_loading("inner"):
        from transformers import modeling_utils
        assert "under inner" in refusal(), refusal()
    assert "under outer" in refusal(), refusal()
assert "under" not in refusal(), refusal()
assert [type(finder).__name__ for finder in sys.meta_path].count("ImportWatcher") == 1  # Lightning's alone
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_a_hidden_peft_stays_hidden(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sys.modules["peft"] = None is how a program hides a package: the context must not import it."""
    monkeypatch.setitem(sys.modules, "peft", None)
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_pretrained(saved)
    assert [weights.adapter for _, _, weights in pending_weights(model)] == [False]


def test_the_path_may_be_passed_by_keyword(saved: Path, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    adapter = a_trained_adapter(saved, tmp_path / "adapter")
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path=saved)
        peft.PeftModel.from_pretrained(model=base, model_id=adapter, is_trainable=True)
    assert [weights.adapter for _, _, weights in pending_weights(base)] == [False, True]


def test_an_adapter_loaded_frozen_is_told_of(saved: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """PEFT loads an adapter for inference unless told is_trainable=True; training it then fails far from here."""
    peft = pytest.importorskip("peft")
    adapter = a_trained_adapter(saved, tmp_path / "adapter")
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(saved), adapter)
    assert "loads the adapter frozen (PEFT's default, for inference): pass is_trainable=True" in caplog.text


def test_a_second_adapter_loaded_in_the_hook_is_read_too(saved: Path, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    adapter = a_trained_adapter(saved, tmp_path / "adapter")
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(saved), peft.LoraConfig(r=2))
        model.load_adapter(adapter, adapter_name="trained")
    materialised(model)
    eager = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(saved), adapter)
    built, expected = model.state_dict(), eager.state_dict()
    trained = [name for name in expected if "lora_B" in name]
    assert trained and all(
        torch.equal(built[name.replace(".default.", ".trained.")], expected[name]) for name in trained
    )


def test_an_adapter_outlives_the_peft_model_around_it(saved: Path, tmp_path: Path) -> None:
    """get_base_model() in configure_model keeps the adapted model; merging before the weights are read is refused."""
    peft = pytest.importorskip("peft")
    adapter = a_trained_adapter(saved, tmp_path / "adapter")
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(saved)
        model = peft.PeftModel.from_pretrained(base, adapter).get_base_model()
    materialised(model)
    eager = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(saved), adapter)
    batch = conformance.data("llama", 4, seed=1).tensors[0]
    torch.testing.assert_close(model(input_ids=batch).logits, eager(input_ids=batch).logits)

    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(saved)
        merged = peft.PeftModel.from_pretrained(base, adapter).merge_and_unload()
    with pytest.raises(
        CheckpointError, match=r"adapter found no parameter.*merged or deleted.*Merge it after training"
    ):
        materialised(merged)


def test_transformers_own_adapter_loading_is_refused_with_what_works(saved: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    adapter = a_trained_adapter(saved, tmp_path / "adapter")
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(saved)
        with pytest.raises(TypeError, match=r"LlamaForCausalLM.load_adapter.*would be lost.*PeftModel.from_pretrained"):
            base.load_adapter(adapter)
    assert transformers.PreTrainedModel.load_adapter.__module__ == "transformers.integrations.peft"  # put back


def test_an_adapter_is_read_once_the_model_is_built_not_in_the_hook(saved: Path, tmp_path: Path) -> None:
    """Tensors made inside a strategy's init context are its placeholders (ZeRO-3 makes them in its dtype on the
    GPU), so PEFT reads only the file's header there: the values arrive when the strategy loads them."""
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file

    adapter = a_trained_adapter(saved, tmp_path / "adapter")
    with hf.deferred_pretrained_loading("test"):
        model = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(saved), adapter)
    lora_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    assert not lora_b.any()  # PEFT's start: B zero
    with torch.no_grad():
        hf.load_pending(model, lambda tensor, weights, original: tensor.copy_(weights.read(original)))
    saved_b = load_file(adapter / "adapter_model.safetensors")[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    ]
    assert lora_b.any() and torch.equal(lora_b, saved_b)


def test_a_missing_adapter_folder_is_refused_as_such(saved: Path, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    original = peft.PeftModel.__dict__["from_pretrained"]
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(saved)
        with pytest.raises(CheckpointError, match=r"no-such-adapter'\): there is no such folder.*adapter_config.json"):
            peft.PeftModel.from_pretrained(base, tmp_path / "no-such-adapter")
    assert peft.PeftModel.__dict__["from_pretrained"] is original


def test_a_pickled_adapter_is_refused_with_how_to_convert_it(saved: Path, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    adapter = a_trained_adapter(saved, tmp_path / "adapter", safe_serialization=False)
    assert (adapter / "adapter_model.bin").is_file()
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(saved)
        with pytest.raises(CheckpointError, match=r"adapter_model.bin \(pickled\).*save_pretrained it again"):
            peft.PeftModel.from_pretrained(base, adapter)


def test_an_adapter_of_another_base_model_is_refused_with_what_to_load(saved: Path, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    narrower = transformers.AutoConfig.from_pretrained(saved)
    narrower.vocab_size = 96  # the head the adapter trains a copy of is narrower than the base model's
    adapter = a_trained_adapter(saved, tmp_path / "adapter", config=narrower)
    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_pretrained(saved)
        refused = r"weight\(s\) of the adapter do not fit.*adapter \[96, 64\], model \[128, 64\].*Load the base model"
        with pytest.raises(CheckpointError, match=refused):
            peft.PeftModel.from_pretrained(base, adapter)


def test_weights_renamed_after_from_pretrained_are_refused_not_left_random(saved: Path) -> None:
    class Wrapped(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.inner(hidden)

    with hf.deferred_pretrained_loading("test"), torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_pretrained(saved)
        model.model.norm = Wrapped(model.model.norm)
    with pytest.raises(CheckpointError, match=r"1 weight\(s\) of the checkpoint found no parameter.*model.norm.weight"):
        materialised(model)


def test_the_exported_folder_is_readable_as_the_umask_allows(saved: Path, tmp_path: Path) -> None:
    import os

    checkpoint = tmp_path / "lightning.ckpt"
    torch.save({"state_dict": transformers.AutoModelForCausalLM.from_pretrained(saved).state_dict()}, checkpoint)
    hf.export(checkpoint, tmp_path / "out", config=saved, prefix="")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o777 & ~umask


def test_a_fabric_state_records_its_model_under_its_key_and_keeps_the_users_entries() -> None:
    """Fabric saves a transformers model itself (the root of the module saved): it is recorded under the state's
    key; a user's own entry named like the record is left as it is, and a load hands the record back to nobody."""
    import transformers

    model = transformers.LlamaForCausalLM(conformance.tiny_config("llama"))
    saved: dict = {}
    hf.record_models(saved, model, under="model")
    assert list(hf.recorded_models(saved)) == ["model"]  # the root, not its inner LlamaModel too
    assert hf.recorded_models(saved)["model"]["class"] == "LlamaForCausalLM"
    assert hf.without_record({"step": 3, **saved}, state={"model": model}) == {"step": 3}
    users = {"hugging_face": "my notes"}
    hf.record_models(users, model, under="model")
    assert users == {"hugging_face": "my notes"}
    assert hf.without_record({"hugging_face": "my notes"}, state={}) == {"hugging_face": "my notes"}
