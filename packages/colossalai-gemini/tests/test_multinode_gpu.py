"""Gemini beyond one machine: two torchrun "nodes" on one GPU machine, each seeing its own GPUs, train, save a
sharded checkpoint folder and resume it, on as many nodes or on another layout (run on the GPU machine with -m gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_strategies.conformance.multinode import (
    FOUR_GPU_LAYOUT_CHANGES,
    Layout,
    layout_change_problems,
    resume_problems,
    staging_leftovers,
    two_nodes_save_and_resume,
)


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


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs four CUDA GPUs")
@pytest.mark.parametrize("layouts", FOUR_GPU_LAYOUT_CHANGES.values(), ids=FOUR_GPU_LAYOUT_CHANGES)
def test_nodes_of_two_gpus_resume_on_another_layout(tmp_path: Path, layouts: tuple[Layout, Layout]) -> None:
    """Two nodes of two GPUs each and one node of two resume each other's checkpoints by ckpt_path:
    Gemini's shards of four processes resumed on two, and of two on four."""
    assert layout_change_problems("colossalai", tmp_path, *layouts) == []
