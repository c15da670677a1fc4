"""Hugging Face transformers models through the fsdp names on two CPU processes: built from a config or with
from_pretrained in configure_model, LoRA adapters, trained, saved and exported back to a Hugging Face folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from lightning_strategies.conformance import hugging_face as conformance

CASES = conformance.EVERY_CASE


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case in one launch of two processes (imports and rendezvous are paid once)."""
    return conformance.launch("fsdp", tmp_path_factory.mktemp("hugging-face"), CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_case(trained: Path, case: conformance.Case) -> None:
    assert conformance.check_results(trained, [case])[case.name] == []


def test_pretrained_weights_are_read_when_nothing_was_built_on_the_meta_device(tmp_path: Path) -> None:
    """A model the user builds on a device of their choosing inside configure_model still gets the file's weights."""
    import torch
    import transformers

    from lightning_strategies.hugging_face import deferred_pretrained_loading
    from lightning_strategies_fsdp.sharding import materialize

    folder = conformance.write_pretrained(tmp_path, "llama")
    with deferred_pretrained_loading("fsdp"), torch.device("cpu"):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    materialize(model, torch.device("cpu"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder)
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def test_processes_draw_alike_for_replicas_and_apart_for_shards(tmp_path: Path) -> None:
    """On the host each process draws from its own generator: replicas must still start equal (FSDP2 never syncs
    them) and shards must not repeat each other."""
    import json

    from lightning_strategies.testing import run_script

    out = tmp_path / "draws.json"
    run_script(Path(__file__).parent / "scripts" / "initial_draws.py", out, env={"OMP_NUM_THREADS": "1"})
    drawn = json.loads(out.read_text())
    assert drawn["fsdp_no_shard"]["replicas_equal"], drawn
    assert drawn["fsdp"]["shards_differ"], drawn


def test_fabric_checkpoint_exports(tmp_path: Path) -> None:
    """``fabric.save`` of a pretrained Llama trained under fsdp exports to a folder that predicts as the trained
    model did: from the sharded folder, and from the one file it converts to."""
    from lightning_strategies import hugging_face
    from lightning_strategies_fsdp.checkpoint import sharded_to_full

    case = conformance.Case("llama", "pretrained")
    conformance.launch("fsdp", tmp_path, [case], face="fabric")
    assert conformance.check_fabric_results(tmp_path, [case]) == {case.name: []}
    run = tmp_path / case.name
    sharded_to_full(run / "fabric.ckpt", run / "fabric-full.ckpt")
    shutil.move(run / "last-exported", run / "from-sharded")
    hugging_face.export(run / "fabric-full.ckpt", run / "last-exported")
    assert conformance.check_fabric_results(tmp_path, [case]) == {case.name: []}
