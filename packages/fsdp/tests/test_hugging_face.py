"""Hugging Face transformers models through the fsdp names on two CPU processes: built from a config or with
from_pretrained in configure_model, LoRA adapters, trained, saved and exported back to a Hugging Face folder."""

from __future__ import annotations

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
