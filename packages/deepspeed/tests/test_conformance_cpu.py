"""lightning-strategies' conformance suite (fit, validate, test, predict, checkpoint round trip,
collectives) on 2 CPU processes.

Two names run here to keep the CPU suite short; ``lightning-strategies check NAME --accelerator
cpu --devices 2`` runs the same for the others (the NVMe name needs an nvme_path, which a name
alone cannot give).
"""

from __future__ import annotations

import pytest

conformance = pytest.importorskip("lightning_strategies.conformance")


@pytest.mark.parametrize("name", ["deepspeed_stage_2", "deepspeed_stage_3_offload"])
def test_conformance_on_cpu(name, monkeypatch, tmp_path):
    from conftest import EXTENSIONS_DIR

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
    report = conformance.run_check(name, accelerator="cpu", devices=2, workdir=tmp_path)
    assert report.passed, str(report)
