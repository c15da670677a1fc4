"""Gemini beyond one machine: two torchrun "nodes" on one two-GPU machine, each seeing its own GPU,
train, save a sharded checkpoint folder and resume it (run on the GPU machine with -m gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_strategies.conformance.multinode import resume_problems, staging_leftovers, two_nodes_save_and_resume


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_nodes_of_one_gpu_each_train_save_and_resume(tmp_path: Path) -> None:
    saving, resuming, checkpoint = two_nodes_save_and_resume(
        "colossalai", tmp_path, accelerator="cuda", visible_devices=["0", "1"]
    )
    reports = saving.rank_reports()
    assert [(report["cluster_environment"], report["node_rank"]) for report in reports] == [
        ("TorchElasticEnvironment", 0),
        ("TorchElasticEnvironment", 1),
    ]
    assert checkpoint.exists() and staging_leftovers(checkpoint.parent) == []
    assert resume_problems(saving, resuming, saved_step=3) == []
