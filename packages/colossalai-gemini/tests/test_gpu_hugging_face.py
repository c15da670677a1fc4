"""GPU tier: Hugging Face transformers models through every colossalai name on one GPU, the strategy's seed page
first: a BERT classifier from a pre-training checkpoint in configure_sharded_model, precision=16."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

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


def test_a_sharded_checkpoint_exports_to_hugging_face(tmp_path: Path) -> None:
    """Gemini's sharded folder (state_dict_type="sharded"), written back out in Hugging Face's layout by
    ``lightning_strategies.hugging_face.export``: the exported model predicts what the trained one did."""
    from lightning.pytorch import Trainer

    from lightning_strategies import hugging_face
    from lightning_strategies_colossalai.strategy import ColossalAIStrategy

    case = conformance.Case("llama", "config")
    module = conformance.HuggingFaceModule(
        case, None, learning_rate=1e-3, optimizer=conformance.optimizer_for("colossalai_cuda")
    )
    trainer = Trainer(
        strategy=ColossalAIStrategy(placement_policy="cuda", state_dict_type="sharded"), accelerator="cuda",
        devices=1, precision="16-mixed", max_steps=case.steps, use_distributed_sampler=False,
        default_root_dir=tmp_path / case.name, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(module)
    (after,) = trainer.predict(module)
    saved = tmp_path / case.name / "last.ckpt"
    assert saved.is_dir(), "Gemini's sharded layout is a folder"
    hugging_face.export(saved, tmp_path / case.name / "last-exported")
    assert conformance.export_problems(tmp_path, case, after, ATOL) == []


HALF, WHOLE = conformance.Case("llama", "pretrained", steps=16), conformance.Case("llama", "pretrained", steps=24)
ON_ONE_GPU = {"accelerator": "cuda", "devices": 1, "precision": "bf16-mixed"}
RESUME_RTOL = 2e-3  # docs/reliability.md: ten times the largest difference measured between strategies


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama read with from_pretrained and fine-tuned under colossalai_cuda (HybridAdam, bf16-mixed) to step 16
    and saved, then resumed from that checkpoint under colossalai_cuda itself: the reference of the resumes below."""
    folder = tmp_path_factory.mktemp("fine-tuned")
    conformance.launch("colossalai_cuda", folder / "half", [HALF], **ON_ONE_GPU)
    saved = folder / "half" / HALF.name / "last.ckpt"
    conformance.launch("colossalai_cuda", folder / "colossalai_cuda", [WHOLE], resume_from=saved, **ON_ONE_GPU)
    return folder


def _with_package(name: str) -> Any:
    """``name`` as a parameter, skipped (before the fixture's launches) where its package is not installed."""
    package = f"lightning_strategies_{name.partition('_')[0]}"
    missing = importlib.util.find_spec(package) is None
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"needs {package}"))


@pytest.mark.parametrize("goes_on_under", [_with_package("fsdp"), _with_package("deepspeed_stage_3")])
def test_a_fine_tuned_llama_goes_on_under_another_strategy(fine_tuned: Path, goes_on_under: str) -> None:
    """Issue 29 with a model nobody here wrote, out of Gemini: its checkpoint resumed by ckpt_path alone under the
    other strategies (AdamW there, HybridAdam's moments carried by parameter name) goes on as Gemini's own resume."""
    saved = fine_tuned / "half" / HALF.name / "last.ckpt"
    conformance.launch(goes_on_under, fine_tuned / goes_on_under, [WHOLE], resume_from=saved, **ON_ONE_GPU)
    resumed, reference = fine_tuned / goes_on_under, fine_tuned / "colossalai_cuda"
    assert conformance.resumed_problems(reference, resumed, WHOLE, saved_step=16, rtol=RESUME_RTOL) == []
