"""Issue 29, item 2 on GPUs: checkpoints of ddp, fsdp, deepspeed and colossalai resumed under one another by
``ckpt_path`` alone (gpu_scripts/cross_strategy.py, launched once per phase on the machine's several GPUs).

Each resume must continue the loss curve of the strategy that saved within 2e-3 relative (bf16-mixed; the strategies'
rounding differs by at most 2.1e-4 there). The 16-bit precisions' conformance tolerance, 2e-2, is too loose for this
model: a resume that lost Adam's moments left it only at its last step, by 5%. The control test holds the tolerance
to telling such a resume apart. Under colossalai the weights and
Adam moments Gemini holds once restored must equal the checkpoint's own, by parameter name: other strategies key
them by name, Gemini by position.
"""

from __future__ import annotations

import sys

import pytest
import torch
from test_gpu import SCRIPTS, launch

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(SCRIPTS))
from cross_strategy import PAIRS, PHASES, SOURCES  # noqa: E402

SEVERAL = min(4, torch.cuda.device_count())
LOSS_TOLERANCE = 2e-3  # docs/reliability.md: ten times the largest difference between the backends' rounding
STEPS_PER_EPOCH = 3


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    if SEVERAL < 2:
        pytest.skip("needs 2 or more CUDA GPUs")
    pytest.importorskip("lightning_strategies_fsdp")
    pytest.importorskip("lightning_strategies_deepspeed")
    out = tmp_path_factory.mktemp("cross-strategy")
    outputs = [launch("cross_strategy.py", str(out), str(SEVERAL), phase, timeout=300)[1] for phase in PHASES]
    found = {path.stem: torch.load(path, weights_only=False) for path in out.glob("*.pt")}
    assert found, "no results:\n" + "\n".join(outputs)
    return found


def succeeded(results: dict[str, dict], key: str) -> dict:
    assert key in results, f"{key} did not run; ran: {sorted(results)}"
    assert "error" not in results[key], results[key].get("traceback", results[key].get("error"))
    return results[key]


@pytest.mark.timeout(500)  # the first test pays for the module's four launches (388 s on two H200s); the tier's 520
@pytest.mark.parametrize("source", list(SOURCES))
def test_every_strategy_trains_and_saves(results, source):
    uninterrupted = succeeded(results, f"uninterrupted-{source}")["losses"]
    assert len(uninterrupted) == 2 * STEPS_PER_EPOCH and all(torch.isfinite(torch.tensor(uninterrupted)))
    first = succeeded(results, f"first-half-{source}")["losses"]
    assert first == pytest.approx(uninterrupted[:STEPS_PER_EPOCH], rel=LOSS_TOLERANCE)
    succeeded(results, f"reference-{source}")


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_the_resume_continues_the_saved_runs_losses(results, source, target):
    resumed = succeeded(results, f"{source}-to-{target}")["losses"]
    expected = succeeded(results, f"uninterrupted-{source}")["losses"][STEPS_PER_EPOCH:]
    assert len(resumed) == STEPS_PER_EPOCH
    assert max(relative_differences(resumed, expected)) <= LOSS_TOLERANCE, (resumed, expected)


def relative_differences(losses: list[float], expected: list[float]) -> list[float]:
    return [abs(got - want) / max(1.0, abs(want)) for got, want in zip(losses, expected, strict=True)]


def test_the_tolerance_tells_a_resume_that_lost_the_adam_moments_apart(results):
    """The negative control: ddp's checkpoint resumed with its Adam moments emptied must leave the tolerance (on one
    H200, bf16-mixed: by 9.5e-3 and 2.1e-2 relative after its first and second step)."""
    lost = succeeded(results, "without-moments-ddp")["losses"]
    expected = succeeded(results, "uninterrupted-ddp")["losses"][STEPS_PER_EPOCH:]
    differences = relative_differences(lost, expected)
    assert differences[0] <= LOSS_TOLERANCE, "the same weights and batch before any step give the same first loss"
    assert max(differences) > LOSS_TOLERANCE, (lost, expected)


@pytest.mark.parametrize("source", list(SOURCES))
def test_colossalai_restores_the_weights_and_adam_moments_by_name(results, source):
    restored = succeeded(results, f"{source}-to-colossalai-full")["restored"]
    saved = succeeded(results, f"reference-{source}")
    assert restored["weights"].keys() == saved["weights"].keys()
    for name, weight in saved["weights"].items():
        assert torch.equal(restored["weights"][name], weight), name
    assert restored["states"].keys() == saved["states"].keys()
    for name, states in saved["states"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(restored["states"][name][key].flatten().float(), states[key].flatten().float()), name
        assert float(restored["states"][name]["step"]) == float(states["step"]) == STEPS_PER_EPOCH
