"""Launching a strategy as a cluster would, on one machine: several torchrun nodes, or SLURM tasks.

Packages check with these that their strategy trains, saves and resumes across nodes, and that
a SLURM job asked to requeue (SIGUSR1) leaves a whole ``hpc`` checkpoint that ``ckpt_path="hpc"``
resumes. Each "node" is a torchrun agent with ``--node-rank`` on localhost; each SLURM "task" is
a process given the variables ``srun`` would set. Every rank runs ``multinode_training.py``.

SLURM itself is absent on the machines that run these checks, so the ``scontrol`` that Lightning
calls to requeue the job is a stand-in (``install_stand_in_scontrol``) that only records its
arguments. It is the one stand-in here: training, checkpoints and signals are real.

Importing this module imports neither torch nor Lightning.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_strategies.conformance.launching import fresh_launch_environment, rank_report_files
from lightning_strategies.testing import free_port

PROGRAM = "lightning_strategies.conformance.multinode_training"
JOB_ID = "4242"
JOB_NAME = "lightning-strategies-requeue-check"  # not "bash"/"interactive", which Lightning treats as no SLURM


@dataclass
class NodeRun:
    """One launch of every node (or task): where it reported, and what each process printed."""

    report: Path
    outputs: list[str] = field(default_factory=list)

    def rank_reports(self) -> list[dict[str, Any]]:
        return [json.loads(file.read_text()) for file in rank_report_files(self.report)]

    def weights(self, moment: str) -> dict[str, Any]:
        """Rank 0's full weights at ``moment``: "start" (after any resume) or "saved" (as the checkpoint holds them)."""
        import torch

        return torch.load(self.report / f"weights.{moment}.pt", weights_only=True)


@dataclass(frozen=True)
class Layout:
    """Torchrun nodes and the processes on each; ``visible_devices[i]`` is node i's ``CUDA_VISIBLE_DEVICES``,
    so that "nodes" on one machine each own their GPUs, as separate machines would (None on CPU)."""

    nodes: int = 2
    per_node: int = 1
    visible_devices: tuple[str, ...] | None = None

    @classmethod
    def on_gpus(cls, nodes: int, per_node: int) -> Layout:
        """Node i owns GPUs i * per_node to (i + 1) * per_node - 1 of this machine."""
        first = [node * per_node for node in range(nodes)]
        return cls(nodes, per_node, tuple(",".join(map(str, range(gpu, gpu + per_node))) for gpu in first))

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node


def training_arguments(
    strategy: str, root: Path, report: Path, max_steps: int, accelerator: str = "cpu", layout: Layout = Layout()
) -> list[str]:
    return [
        "--strategy", strategy, "--accelerator", accelerator, "--devices", str(layout.per_node),
        "--num-nodes", str(layout.nodes), "--root", str(root), "--report", str(report), "--max-steps", str(max_steps),
    ]  # fmt: skip


def launch_torchrun_nodes(arguments: Sequence[str], report: Path, layout: Layout, timeout: float = 600) -> NodeRun:
    """Start the layout's torchrun agents together (static rendezvous on localhost)."""
    port = free_port()
    commands, environments = [], []
    for node in range(layout.nodes):
        commands.append([
            sys.executable, "-m", "torch.distributed.run", "--nnodes", str(layout.nodes),
            "--nproc-per-node", str(layout.per_node), "--node-rank", str(node), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--module", PROGRAM, *arguments,
        ])  # fmt: skip
        extra = {"OMP_NUM_THREADS": "1"}
        if layout.visible_devices is not None:
            extra["CUDA_VISIBLE_DEVICES"] = layout.visible_devices[node]
        environments.append(fresh_launch_environment(extra))
    return _run_together(commands, environments, report, timeout)


def install_stand_in_scontrol(folder: Path, log: Path) -> Path:
    """Write a stand-in ``scontrol`` into ``folder`` (put it first on PATH) that appends its arguments to ``log``.

    A stand-in, because no SLURM exists where the checks run: it records the requeue request
    (``scontrol requeue <job id>``) that Lightning's signal handler makes, and requeues nothing.
    """
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\n# Stand-in for SLURM\'s scontrol: records the call only.\necho "$@" >> "{log}"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def launch_slurm_tasks(
    arguments: Sequence[str], report: Path, scontrol_folder: Path, tasks: int = 2, timeout: float = 600
) -> NodeRun:
    """Start ``tasks`` processes, one per "node", with the variables ``srun --nodes=N --ntasks-per-node=1`` sets.

    ``scontrol_folder`` goes first on PATH: it holds the stand-in ``scontrol``.
    """
    port = free_port()
    commands, environments = [], []
    for task in range(tasks):
        commands.append([sys.executable, "-m", PROGRAM, *arguments])
        environments.append(
            fresh_launch_environment(
                {
                    "OMP_NUM_THREADS": "1",
                    "PATH": f"{scontrol_folder}{os.pathsep}{os.environ.get('PATH', '')}",
                    "SLURM_JOB_ID": JOB_ID,
                    "SLURM_JOB_NAME": JOB_NAME,
                    "SLURM_NTASKS": str(tasks),
                    "SLURM_NTASKS_PER_NODE": "1",
                    "SLURM_NNODES": str(tasks),
                    "SLURM_NODELIST": "127.0.0.1",
                    "SLURM_NODEID": str(task),
                    "SLURM_PROCID": str(task),
                    "SLURM_LOCALID": "0",
                    # Lightning's SLURMEnvironment derives a port from the job id unless told one; a free one avoids
                    # colliding with another check running on the same machine.
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                }
            )
        )
    return _run_together(commands, environments, report, timeout)


def two_nodes_save_and_resume(
    strategy: str,
    workdir: Path,
    accelerator: str = "cpu",
    visible_devices: Sequence[str] | None = None,
    steps: tuple[int, int] = (3, 5),
    timeout: float = 600,
) -> tuple[NodeRun, NodeRun, Path]:
    """Train ``steps[0]`` steps on two torchrun nodes of one process each and save; then resume on two new nodes
    up to ``steps[1]``. Returns the saving run, the resuming run and the checkpoint's path (under ``workdir/root``).
    """
    layout = Layout(2, 1, tuple(visible_devices) if visible_devices is not None else None)
    return save_and_resume(strategy, workdir, layout, layout, accelerator, steps, timeout)


def save_and_resume(
    strategy: str,
    workdir: Path,
    saving_layout: Layout,
    resuming_layout: Layout,
    accelerator: str = "cpu",
    steps: tuple[int, int] = (3, 5),
    timeout: float = 600,
) -> tuple[NodeRun, NodeRun, Path]:
    """Train ``steps[0]`` steps laid out as ``saving_layout`` and save; then resume laid out as ``resuming_layout``
    (another number of nodes or of processes, or both) up to ``steps[1]``, by ``ckpt_path`` alone."""
    root = workdir / "root"
    checkpoint = root / "saved.ckpt"
    save = training_arguments(strategy, root, workdir / "save", steps[0], accelerator, saving_layout)
    saving = launch_torchrun_nodes([*save, "--save-to", str(checkpoint)], workdir / "save", saving_layout, timeout)
    resume = training_arguments(strategy, root, workdir / "resume", steps[1], accelerator, resuming_layout)
    resuming = launch_torchrun_nodes(
        [*resume, "--ckpt-path", str(checkpoint)], workdir / "resume", resuming_layout, timeout
    )
    return saving, resuming, checkpoint


@dataclass
class RequeueOutcome:
    signalled: NodeRun  # the run that received SIGUSR1
    resumed: NodeRun  # the requeued run, started with ckpt_path="hpc"
    root: Path  # the Trainer's default_root_dir, where Lightning puts hpc checkpoints
    scontrol_calls: list[str]  # what the stand-in scontrol was called with, one line per call

    @property
    def hpc_checkpoints(self) -> list[Path]:
        return sorted(self.root.glob("hpc_ckpt_*"))


def slurm_requeue_and_resume(
    strategy: str, workdir: Path, tasks: int = 2, requeue_at_step: int = 3, max_steps: int = 5, timeout: float = 600
) -> RequeueOutcome:
    """A SLURM job of ``tasks`` nodes gets the requeue signal at ``requeue_at_step``; the requeued job resumes.

    The requeued job runs with ``ckpt_path="hpc"`` under the same SLURM variables, as the
    requeued job would, and trains on to ``max_steps``.
    """
    root = workdir / "root"
    scontrol_log = workdir / "scontrol-calls.txt"
    stand_in = workdir / "stand-in-bin"
    install_stand_in_scontrol(stand_in, scontrol_log)
    signalled = launch_slurm_tasks(
        [*training_arguments(strategy, root, workdir / "signalled", max_steps, layout=Layout(tasks)),
         "--requeue-at-step", str(requeue_at_step)],
        workdir / "signalled", stand_in, tasks, timeout,
    )  # fmt: skip
    resumed = launch_slurm_tasks(
        [*training_arguments(strategy, root, workdir / "resumed", max_steps, layout=Layout(tasks)),
         "--ckpt-path", "hpc"],
        workdir / "resumed", stand_in, tasks, timeout,
    )  # fmt: skip
    calls = scontrol_log.read_text().splitlines() if scontrol_log.exists() else []
    return RequeueOutcome(signalled, resumed, root, calls)


def staging_leftovers(root: Path) -> list[Path]:
    """Whatever a save left in its staging folder under ``root``: nothing, once every save was published."""
    from lightning_strategies.checkpoints import STAGING_FOLDER

    staging = root / STAGING_FOLDER
    return sorted(staging.rglob("*")) if staging.exists() else []


def resume_problems(saving: NodeRun, resuming: NodeRun, saved_step: int, ranks: int = 2) -> list[str]:
    """What is wrong with a resume: each of its ``ranks`` must start at ``saved_step`` and train on, and the weights
    gathered on rank 0 at the start must be the saved ones."""
    problems = []
    reports = resuming.rank_reports()
    if len(reports) != ranks:
        problems.append(f"{len(reports)} of {ranks} ranks reported after resuming")
    for report in reports:
        if report["start_step"] != saved_step:
            problems.append(f"rank {report['global_rank']} resumed at step {report['start_step']}, not {saved_step}")
        if report["end_step"] <= report["start_step"]:
            problems.append(
                f"rank {report['global_rank']} did not train after resuming (ended at {report['end_step']})"
            )
    saved, started = saving.weights("saved"), resuming.weights("start")
    if saved.keys() != started.keys():
        problems.append(f"resumed parameters {sorted(started)} differ from the saved ones {sorted(saved)}")
    for name in saved.keys() & started.keys():
        difference = float((saved[name] - started[name]).abs().max())
        if difference > 1e-6:
            problems.append(f"{name}: resumed weights differ from the saved ones by up to {difference:.3g}")
    return problems


def two_node_problems(strategy: str, workdir: Path, checkpoint_files: Sequence[str]) -> list[str]:
    """Two torchrun nodes train, save and resume ``strategy`` on CPU: what went wrong, nothing when all is right.

    ``checkpoint_files`` are paths inside the checkpoint folder that each node's share must appear as.
    """
    saving, resuming, checkpoint = two_nodes_save_and_resume(strategy, workdir)
    problems = []
    ranks = [(rank["cluster_environment"], rank["node_rank"], rank["local_rank"]) for rank in saving.rank_reports()]
    if ranks != [("TorchElasticEnvironment", 0, 0), ("TorchElasticEnvironment", 1, 0)]:
        problems.append(f"ranks seen (environment, node rank, local rank): {ranks}, not one per torchrun node")
    if [rank["world_size"] for rank in saving.rank_reports()] != [2, 2]:
        problems.append("the world size was not 2 on both nodes")
    problems += _checkpoint_problems(checkpoint, checkpoint_files)
    return problems + resume_problems(saving, resuming, saved_step=3)


# Layout changes a four-GPU machine checks: two nodes of two GPUs resumed on one node of two, and back.
FOUR_GPU_LAYOUT_CHANGES = {
    "2x2-then-1x2": (Layout.on_gpus(2, 2), Layout.on_gpus(1, 2)),
    "1x2-then-2x2": (Layout.on_gpus(1, 2), Layout.on_gpus(2, 2)),
}


def layout_change_problems(
    strategy: str,
    workdir: Path,
    saved_on: Layout,
    resumed_on: Layout,
    accelerator: str = "cuda",
    checkpoint_files: Sequence[str] = (),
) -> list[str]:
    """Train and save laid out as ``saved_on``, resume as ``resumed_on`` (another number of nodes or processes) by
    ``ckpt_path`` alone: what went wrong, nothing when all is right. ``checkpoint_files``: paths inside a checkpoint
    folder that every saving process's share must appear as."""
    saving, resuming, checkpoint = save_and_resume(strategy, workdir, saved_on, resumed_on, accelerator)
    problems = []
    for layout, run in ((saved_on, saving), (resumed_on, resuming)):
        expected = [(node, local, layout.ranks) for node in range(layout.nodes) for local in range(layout.per_node)]
        seen = [(rank["node_rank"], rank["local_rank"], rank["world_size"]) for rank in run.rank_reports()]
        if seen != expected:
            problems.append(f"ranks seen (node, local rank, world size): {seen}, not {expected}")
    if not checkpoint.exists():
        problems.append(f"nothing saved at {checkpoint}")
    problems += _checkpoint_problems(checkpoint, checkpoint_files)
    return problems + resume_problems(saving, resuming, saved_step=3, ranks=resumed_on.ranks)


def slurm_requeue_problems(strategy: str, workdir: Path, checkpoint_files: Sequence[str]) -> list[str]:
    """Two SLURM tasks get the requeue signal at step 3, save ``hpc_ckpt_1.ckpt`` and are requeued (through the
    stand-in scontrol); the requeued job resumes it. What went wrong, nothing when all is right."""
    outcome = slurm_requeue_and_resume(strategy, workdir, requeue_at_step=3)
    reports = outcome.signalled.rank_reports()
    problems = []
    if [report["cluster_environment"] for report in reports] != ["SLURMEnvironment"] * 2:
        problems.append(f"environments seen: {[report['cluster_environment'] for report in reports]}, not SLURM's")
    if [report["requeued_at_step"] for report in reports] != [3, 3]:
        problems.append(f"signalled at steps {[report['requeued_at_step'] for report in reports]}, not 3 on both")
    if outcome.scontrol_calls != [f"requeue {JOB_ID}"]:
        problems.append(f"scontrol calls: {outcome.scontrol_calls}, not one 'requeue {JOB_ID}' from rank 0")
    names = [path.name for path in outcome.hpc_checkpoints]
    if names != ["hpc_ckpt_1.ckpt"]:
        return [*problems, f"hpc checkpoints: {names}, not one hpc_ckpt_1.ckpt"]
    problems += _checkpoint_problems(outcome.hpc_checkpoints[0], checkpoint_files)
    return problems + resume_problems(outcome.signalled, outcome.resumed, saved_step=3)


def _checkpoint_problems(checkpoint: Path, checkpoint_files: Sequence[str]) -> list[str]:
    """The ``checkpoint_files`` missing from ``checkpoint``, and whatever was left in staging beside it or inside it
    (a conversion on resume, DeepSpeed's universal form, stages inside the checkpoint folder)."""
    problems = [f"{name} missing from {checkpoint}" for name in checkpoint_files if not (checkpoint / name).exists()]
    staged = staging_leftovers(checkpoint.parent) + (staging_leftovers(checkpoint) if checkpoint.is_dir() else [])
    return problems + [f"left in staging: {path}" for path in staged]


def _run_together(
    commands: list[list[str]], environments: list[dict[str, str]], report: Path, timeout: float
) -> NodeRun:
    report.mkdir(parents=True, exist_ok=True)
    # Output goes to files, not pipes: a node blocked on a full pipe while another waits for it in a
    # collective would hang both.
    logs = [report / f"output.node{index}.log" for index in range(len(commands))]
    processes = []
    for command, environment, log in zip(commands, environments, logs, strict=True):
        with log.open("w") as output:
            # A new session each, so that a timeout ends the workers torchrun started along with it.
            processes.append(
                subprocess.Popen(
                    command, stdout=output, stderr=subprocess.STDOUT, env=environment, start_new_session=True
                )
            )
    deadline = time.monotonic() + timeout
    timed_out = False
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            for other in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(other.pid, signal.SIGKILL)
            process.wait()
    run = NodeRun(report, [log.read_text(errors="replace") for log in logs])
    if timed_out:
        run.outputs = [output + f"\n(timed out after {timeout:.0f} s; every node was killed)" for output in run.outputs]
    failed = [index for index, process in enumerate(processes) if process.returncode != 0]
    if failed:
        tails = "\n".join(
            f"--- node {index} (exit code {processes[index].returncode}):\n{run.outputs[index][-5000:]}"
            for index in failed
        )
        raise RuntimeError(f"node(s) {failed} of {len(processes)} failed:\n{tails}")
    return run
