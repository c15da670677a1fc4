"""GPU tier: Hugging Face transformers models through every colossalai name on one GPU, the strategy's seed page
first: a BERT classifier from a pre-training checkpoint in configure_sharded_model, precision=16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_strategies.conformance import hugging_face as conformance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
# The seed's example, then decoders from a config and from a checkpoint (LoRA is refused: test_lazy_init.py).
CASES = [
    conformance.Case("bert", "pretrained"),
    conformance.Case("llama", "config"),
    conformance.Case("qwen3", "pretrained"),
]
ATOL = 3e-2  # fp16 mixed precision against plain transformers in fp32
RTOL = 2**-10  # Gemini makes its fp32 master weights from fp16 copies: loaded weights come back rounded


@pytest.fixture(scope="module", params=["colossalai", "colossalai_cuda", "colossalai_cpu", "colossalai_auto"])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    return conformance.launch(
        request.param, folder, CASES, accelerator="cuda", devices=1, precision="16",
        hook="configure_sharded_model",
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_case(trained: Path, case: conformance.Case) -> None:
    assert conformance.check_results(trained, [case], atol=ATOL, rtol=RTOL)[case.name] == []
