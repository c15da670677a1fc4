"""torchao's float8 training under ``deepspeed_stage_3``: the user converts the decoder layers in configure_model,
ZeRO-3 partitions the converted layers like any others, and training follows ``ddp``'s float8 run (within 1e-5)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import EXTRA, UNSET

from lightning_strategies.testing import run_script

transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("torchao") is None:  # found, not imported: the script imports it in its own processes
    pytest.skip("torchao is not installed", allow_module_level=True)

SCRIPT = Path(__file__).parent / "float8_script.py"


def test_float8_layers_train_under_zero3_as_under_ddp(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "pretrained")
    out = tmp_path / "losses.json"
    env = {**EXTRA, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    run_script(SCRIPT, tmp_path / "pretrained", out, env=env, unset=UNSET, timeout=600)
    ddp, zero3 = (json.loads(out.read_text())[name] for name in ("ddp", "deepspeed_stage_3"))
    # two layers of seven projections each, converted; ZeRO-3 holds every one as a partition, ddp none
    assert (ddp["float8_layers"], zero3["float8_layers"]) == (14, 14)
    assert (ddp["partitioned"], zero3["partitioned"]) == (False, True)
    assert len(ddp["losses"]) == 6 and ddp["losses"][-1] < ddp["losses"][0]
    assert zero3["losses"] == pytest.approx(ddp["losses"], rel=1e-5)
