"""torchao's float8 training under ``fsdp`` (the user converts in configure_model): trained, resumed, and with
float8 gathers the scales computed in one all-reduce before every forward (lightning_strategies_fsdp.float8)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
if importlib.util.find_spec("torchao") is None:  # found, not imported: the script imports it in its own processes
    pytest.skip("torchao is not installed", allow_module_level=True)

from lightning_strategies.testing import run_script

SCRIPT = Path(__file__).parent / "scripts" / "float8.py"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("float8") / "results.json"
    run_script(SCRIPT, out, env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}, timeout=600)
    return json.loads(out.read_text())


def test_float8_gathers_train_as_bf16_gathers_do(results: dict[str, dict]) -> None:
    """The scales computed ahead for all weights are those each weight's gather computes for itself: the same
    float8 values, the same losses."""
    losses = results["tensorwise"]["losses"]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert results["all-gather"]["losses"] == pytest.approx(losses, rel=1e-6)


@pytest.mark.parametrize("config", ["tensorwise", "all-gather"])
def test_a_float8_model_resumes_from_its_checkpoint(results: dict[str, dict], config: str) -> None:
    assert results[config]["resumed_losses"] == pytest.approx(results[config]["losses"], rel=1e-6)


def test_every_training_step_gathers_with_the_scales_of_its_weights(results: dict[str, dict]) -> None:
    """Computed ahead before each step, of the weights the last optimizer step left; dropped after each step."""
    gathered = results["all-gather"]
    assert gathered["scales_in_steps"] == [True] * 6
    assert gathered["dropped_after_steps"] == [True] * 6


def test_weights_changed_outside_the_optimizer_are_gathered_with_their_own_scales(results: dict[str, dict]) -> None:
    """A scale computed ahead and kept across a change of the weights would clip them silently."""
    assert results["all-gather"]["scales_current"] is True


@pytest.mark.parametrize("config", ["tensorwise", "all-gather"])
def test_set_up_again_leaves_lightning_seeing_the_models_own_methods(results: dict[str, dict], config: str) -> None:
    """predict after fit sets the strategy up again: the step methods are wrapped anew, not wrapped twice (FSDP2's
    wrappers alone under tensorwise), Lightning still finds no validation_step of the model's own, and the forward
    hooks are as many as before."""
    assert results[config]["validation_step_overridden"] is False
    before, after = results[config]["forward_pre_hooks"]
    assert before == after


def test_offloaded_weights_keep_torchaos_own_scales(results: dict[str, dict]) -> None:
    """FSDP2 gathers offloaded weights from a copy on the accelerator, which would not carry a scale computed ahead."""
    assert results["offloaded"] == {"scales_in_steps": [False, False], "forward_hook": False}


def test_fabric_steps_gather_with_the_scales_of_their_weights(tmp_path: Path) -> None:
    """Through Fabric the root's forward computes them (a hook), and its optimizer step drops them: also those of
    float8 weights the optimizer was given after its set-up."""
    out = tmp_path / "fabric.json"
    run_script(SCRIPT, out, "fabric", env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}, timeout=600)
    assert json.loads(out.read_text()) == {"scales_in_steps": [True] * 3, "dropped_after_steps": [True] * 3}
