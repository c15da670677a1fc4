"""FSDP2 beyond one machine, on CPU: two torchrun nodes train, save a sharded DCP folder and resume it;
a SLURM job asked to requeue (SIGUSR1) saves its hpc checkpoint whole and ``ckpt_path="hpc"`` resumes it.

The SLURM check runs two tasks (one per "node") with the variables srun would set. SLURM itself is
absent here, so the ``scontrol`` Lightning calls to requeue is a stand-in that records its arguments
(see lightning_strategies.conformance.multinode); training, checkpoints and the signal are real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_strategies.conformance.multinode import (
    FOUR_GPU_LAYOUT_CHANGES,
    Layout,
    layout_change_problems,
    resume_problems,
    slurm_requeue_problems,
    staging_leftovers,
    two_node_problems,
    two_nodes_save_and_resume,
)

STRATEGY = "fsdp"  # FULL_SHARD: one mesh dimension over both nodes
SHARD_FILES = ("__0_0.distcp", "__1_0.distcp", ".checksums-0.json", ".checksums-1.json", ".metadata", "meta.pt")


def test_two_torchrun_nodes_train_save_and_resume(tmp_path: Path) -> None:
    assert two_node_problems(STRATEGY, tmp_path, SHARD_FILES) == []  # both nodes wrote into the one folder


def test_two_nodes_of_two_processes_resume_on_one_node_of_two(tmp_path: Path) -> None:
    """The DCP folder of four processes on two nodes reshards onto two processes on one."""
    layouts = Layout(nodes=2, per_node=2), Layout(nodes=1, per_node=2)
    shards = [f"__{rank}_0.distcp" for rank in range(4)]
    assert layout_change_problems(STRATEGY, tmp_path, *layouts, accelerator="cpu", checkpoint_files=shards) == []


def test_slurm_requeue_signal_saves_hpc_checkpoint_that_resumes(tmp_path: Path) -> None:
    assert slurm_requeue_problems(STRATEGY, tmp_path, SHARD_FILES) == []


@pytest.mark.gpu
def test_two_nodes_of_one_gpu_each_train_save_and_resume(tmp_path: Path) -> None:
    """Two "nodes" on one two-GPU machine, each seeing its own GPU; hybrid sharding spans the nodes."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    saving, resuming, checkpoint = two_nodes_save_and_resume(
        "fsdp_hybrid_shard", tmp_path, accelerator="cuda", visible_devices=["0", "1"]
    )
    assert [report["node_rank"] for report in saving.rank_reports()] == [0, 1]
    assert checkpoint.is_dir() and staging_leftovers(checkpoint.parent) == []
    assert resume_problems(saving, resuming, saved_step=3) == []


@pytest.mark.gpu
@pytest.mark.parametrize("layouts", FOUR_GPU_LAYOUT_CHANGES.values(), ids=FOUR_GPU_LAYOUT_CHANGES)
def test_nodes_of_two_gpus_resume_on_another_layout(tmp_path: Path, layouts: tuple[Layout, Layout]) -> None:
    """Two nodes of two GPUs each and one node of two resume each other's checkpoints by ckpt_path:
    hybrid sharding's (replicate, shard) mesh of (2, 2) resharded to (1, 2), and back."""
    import torch

    if torch.cuda.device_count() < 4:
        pytest.skip("needs four CUDA GPUs")
    assert layout_change_problems("fsdp_hybrid_shard", tmp_path, *layouts) == []
