"""DeepSpeed beyond one machine, on CPU: two torchrun nodes train, save a ZeRO-3 checkpoint folder and resume it;
a SLURM job asked to requeue (SIGUSR1) saves its hpc checkpoint whole and ``ckpt_path="hpc"`` resumes it.

The SLURM check runs two tasks (one per "node") with the variables srun would set. SLURM itself is
absent here, so the ``scontrol`` Lightning calls to requeue is a stand-in that records its arguments
(see lightning_strategies.conformance.multinode); training, checkpoints and the signal are real.
The last tests are the GPU tier's (-m gpu): the same two-node run with one GPU per node, and two nodes of two GPUs
resumed on one node of two and back.
"""

from __future__ import annotations

import os
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

STRATEGY = "deepspeed_stage_3"  # parameters, gradients and optimizer states partitioned across the nodes
SHARD_FILES = (
    "checkpoint/zero_pp_rank_0_mp_rank_00_model_states.pt",
    "checkpoint/zero_pp_rank_1_mp_rank_00_model_states.pt",
)


def test_two_torchrun_nodes_train_save_and_resume(tmp_path: Path) -> None:
    assert two_node_problems(STRATEGY, tmp_path, SHARD_FILES) == []  # both nodes wrote into the one folder


def test_slurm_requeue_signal_saves_hpc_checkpoint_that_resumes(tmp_path: Path) -> None:
    assert slurm_requeue_problems(STRATEGY, tmp_path, SHARD_FILES) == []


def test_ranks_of_a_slurm_task_are_exported_where_deepspeed_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """srun sets no LOCAL_RANK, which DeepSpeed's engine requires; both strategy faces export them first."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from lightning_strategies_deepspeed.backend import export_ranks

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    slurm = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}
    for name, value in {**slurm, "SLURM_NODEID": "1", "SLURM_JOB_ID": "4242", "SLURM_NODELIST": "node[7-8]"}.items():
        monkeypatch.setenv(name, value)
    export_ranks(SLURMEnvironment())
    exported = {name: os.environ[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    assert exported == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "node7",
        "MASTER_PORT": "19242",
    }


@pytest.mark.gpu
def test_two_nodes_of_one_gpu_each_train_save_and_resume(tmp_path: Path) -> None:
    """Two "nodes" on one two-GPU machine, each seeing its own GPU; ZeRO-3 partitions across the nodes (NCCL)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    saving, resuming, checkpoint = two_nodes_save_and_resume(
        STRATEGY, tmp_path, accelerator="cuda", visible_devices=["0", "1"]
    )
    assert [report["node_rank"] for report in saving.rank_reports()] == [0, 1]
    assert checkpoint.is_dir() and staging_leftovers(checkpoint.parent) == []
    assert resume_problems(saving, resuming, saved_step=3) == []


@pytest.mark.gpu
@pytest.mark.parametrize("layouts", FOUR_GPU_LAYOUT_CHANGES.values(), ids=FOUR_GPU_LAYOUT_CHANGES)
def test_nodes_of_two_gpus_resume_on_another_layout(tmp_path: Path, layouts: tuple[Layout, Layout]) -> None:
    """Two nodes of two GPUs each and one node of two resume each other's checkpoints by ckpt_path:
    ZeRO-3 partitions of four processes resumed on two and of two on four (through DeepSpeed's universal
    layout, on the fly)."""
    import torch

    if torch.cuda.device_count() < 4:
        pytest.skip("needs four CUDA GPUs")
    assert layout_change_problems(STRATEGY, tmp_path, *layouts) == []
