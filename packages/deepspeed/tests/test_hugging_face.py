"""Hugging Face transformers models through deepspeed_stage_3 on two CPU processes: built from a config or with
from_pretrained in configure_model (as ZeRO-3 partitions), LoRA adapters, trained, saved and exported back to a
Hugging Face folder."""

from __future__ import annotations

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
