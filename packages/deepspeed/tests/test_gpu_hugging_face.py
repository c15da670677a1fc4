"""GPU tier: Hugging Face transformers models through the ZeRO names on one GPU: the seed's BERT classifier from a
pre-training checkpoint, decoders from a config and from a checkpoint, a new LoRA adapter and a
trained one loaded to go on training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import EXTRA, UNSET

from lightning_strategies.conformance import hugging_face as conformance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
NAMES = ["deepspeed_stage_3", "deepspeed_stage_3_offload", "deepspeed_stage_2"]
CASES = [conformance.Case("bert", "pretrained"), conformance.Case("llama", "config"),
         conformance.Case("qwen3", "pretrained"), conformance.Case("llama", "lora"),
         conformance.Case("llama", "adapter")]  # fmt: skip
ATOL = 3e-2  # bf16 mixed precision against plain transformers in fp32
LOGITS_RTOL = 2**-7  # of the largest logit: bf16 rounds to 2**-8 of what it multiplies
RTOL = 2**-8  # DeepSpeed's bf16 mode makes its fp32 master weights from bf16 copies: loaded weights come back rounded


@pytest.fixture(scope="module", params=NAMES)
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    return conformance.launch(
        request.param, folder, CASES, accelerator="cuda", devices=1, precision="bf16-mixed", env=EXTRA, unset=UNSET
    )


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_case(trained: Path, case: conformance.Case) -> None:
    assert conformance.check_results(trained, [case], atol=ATOL, logits_rtol=LOGITS_RTOL, rtol=RTOL)[case.name] == []
