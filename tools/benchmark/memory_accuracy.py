"""The planner's predictions against measured peaks: for each configuration, one short fit in fresh processes.

    python -m tools.benchmark.memory_accuracy --out "$OUT"                     # the default set, one GPU
    python -m tools.benchmark.memory_accuracy --out "$OUT" --only ds3-ratio-6.7b,fsdp-1.3b
    python -m tools.benchmark.memory_accuracy --list

Per configuration it records ``torch.cuda.max_memory_allocated`` of every device (each rank writes its
own) and the peak resident memory of the whole process tree (every rank and this launcher's child,
sampled from /proc every 0.2 s: host memory is one pool for all ranks, which is what the planner
predicts), next to ``lightning_strategies.planning``'s prediction for the same strategy and settings.
Writes ``memory-accuracy.json`` and ``memory-accuracy.md`` (the table docs/which-strategy.md keeps).
Issue 13 asks for 8 configurations within 10% on both peaks; docs/which-strategy.md keeps the table of the
last GPU session.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tools.benchmark

from tools.benchmark import environment
from tools.benchmark.sizes import SIZES, VOCABULARY

REPOSITORY = Path(__file__).resolve().parents[2]
TOLERANCE = 0.10  # issue 13: within 10% of measured
BUILTIN = "lightning:"  # a configuration's strategy with this prefix is Lightning's own class, not our name


@dataclasses.dataclass(frozen=True)
class Configuration:
    id: str
    strategy: str
    size: str
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    micro_batch: int = 8
    length: int = 1024
    devices: int = 1
    precision: str = "bf16-mixed"
    # "partial": use whatever share of offload the planner chooses for this strategy (its settings win).
    planned: str | None = None
    activation_checkpointing: bool = False
    # Every step trains on the same sequences: random tokens cannot be learnt in 10 steps (the loss stays near
    # ln(vocabulary)), one batch can, so a falling loss shows that the optimizer steps reach the weights.
    same_batch: bool = False
    # Micro-batches per optimizer step (Trainer's accumulate_grad_batches): more tokens for each optimizer step,
    # which with an offloaded optimizer is what MFU follows. --steps counts optimizer steps.
    accumulate: int = 1
    # Launched as this many torchrun "nodes" on this machine, ``devices`` GPUs each; host peaks are per node.
    nodes: int = 1
    # Strategy arguments the memory model does not read (speed settings): passed to the strategy, not matched
    # against the planner's candidates.
    tuning: dict[str, Any] = dataclasses.field(default_factory=dict)


# Sizes that fit one H200 (139 GiB) for each strategy, spread over no offload, partial and full offload.
CONFIGURATIONS = [
    Configuration("fsdp-1.3b", "fsdp", "1.3b"),
    Configuration("fsdp-offload-2.7b", "fsdp_cpu_offload", "2.7b"),
    Configuration("ds2-1.3b", "deepspeed_stage_2", "1.3b", {"stage": 2}),
    Configuration("ds3-2.7b", "deepspeed_stage_3", "2.7b", {"stage": 3}),
    Configuration("ds3-ratio-6.7b", "deepspeed_stage_3", "6.7b", planned="partial"),
    Configuration("ds3-offload-2.7b", "deepspeed_stage_3_offload", "2.7b",
                  {"stage": 3, "offload_optimizer": True, "offload_parameters": True}),
    Configuration("ds3-offload-2.7b-mb4", "deepspeed_stage_3_offload", "2.7b",
                  {"stage": 3, "offload_optimizer": True, "offload_parameters": True}, micro_batch=4),
    Configuration("gemini-cuda-1.3b", "colossalai_cuda", "1.3b"),
    Configuration("gemini-cpu-2.7b", "colossalai_cpu", "2.7b"),
    Configuration("ds3-2x-2.7b", "deepspeed_stage_3", "2.7b", {"stage": 3}, devices=2),
    Configuration("fsdp-2x-2.7b", "fsdp", "2.7b", devices=2),
]  # fmt: skip
# The largest model on one H200 with 128 GiB of host memory (issue 13): the planner's partial offload of each
# backend, every block checkpointed, 16 sequences a step; run with --steps 10 to see the loss fall. Gemini runs in
# fp16: with bf16 gradients HybridAdam updates CPU-held chunks in plain torch instead of its C++ kernel.
LARGEST = [
    # The same settings at 2.7B, with the plan made for a 40 GiB GPU (--gpu-memory 40) so that it offloads a share.
    Configuration("partial-gemini-2.7b", "colossalai", "2.7b", micro_batch=16, precision="16-mixed",
                  planned="partial", activation_checkpointing=True),
    Configuration("largest-gemini-13b", "colossalai", "13b", micro_batch=16, precision="16-mixed", planned="partial",
                  activation_checkpointing=True, same_batch=True),
    Configuration("largest-ds3-10b", "deepspeed_stage_3", "10b", micro_batch=16, planned="partial",
                  activation_checkpointing=True, same_batch=True),
    # The same with 4 micro-batches an optimizer step: the optimizer's CPU share is paid once per 64k tokens.
    Configuration("largest-ds3-10b-accumulate-4", "deepspeed_stage_3", "10b", micro_batch=16, planned="partial",
                  activation_checkpointing=True, same_batch=True, accumulate=4),
    # DeepSpeed at 13B: 8 sequences a micro-batch keep the activations small, 8 micro-batches a step keep the
    # optimizer's share of the time. Until the offloaded gradients accumulated in fp32 without a 16-bit host slot,
    # and the plan counted DeepSpeed's sub-groups tensor by tensor, the plan found no share within its margins on
    # one H200 (it was run with --gpu-memory 155 --host-memory 135, for 50%); since, the machine as detected.
    Configuration("largest-ds3-13b-accumulate-8", "deepspeed_stage_3", "13b", micro_batch=8, planned="partial",
                  activation_checkpointing=True, same_batch=True, accumulate=8),
    # ZeRO-3's partial offload at a size that sets up in seconds: with --gpu-memory 38 the plan offloads about half,
    # with the 16-bit host slots. The tenth session compared those slots with fp32 host gradients here, each on the
    # code of a commit that did one or the other (docs/which-strategy.md, "DeepSpeed's offload ratio").
    Configuration("partial-ds3-2.7b-accumulate-8", "deepspeed_stage_3", "2.7b", micro_batch=8, planned="partial",
                  activation_checkpointing=True, same_batch=True, accumulate=8),
    # Where the offloaded share's gradients accumulate, the plan's share kept: in the fp32 gradients on the host
    # (twice the PCIe traffic of the 16-bit host slots), and on the GPU until the optimizer step (one copy to
    # the host a step). At 13B the plan finds no room on the GPU for that buffer: run as tuning beside it.
    Configuration("partial-ds3-2.7b-accumulate-8-fp32", "deepspeed_stage_3", "2.7b", micro_batch=8, planned="partial",
                  activation_checkpointing=True, same_batch=True, accumulate=8,
                  tuning={"offloaded_gradients_in_fp32": True}),
    Configuration("partial-ds3-2.7b-accumulate-8-on-gpu", "deepspeed_stage_3", "2.7b", micro_batch=8,
                  planned="partial", activation_checkpointing=True, same_batch=True, accumulate=8,
                  tuning={"offloaded_gradients_on_gpu": True}),
    Configuration("largest-ds3-13b-accumulate-8-on-gpu", "deepspeed_stage_3", "13b", micro_batch=8,
                  planned="partial", activation_checkpointing=True, same_batch=True, accumulate=8,
                  tuning={"offloaded_gradients_on_gpu": True}),
    # Four times the tokens an optimizer step (262,144), which with the gradients accumulating on the GPU costs
    # no more PCIe traffic: the optimizer's CPU share paid once per 32 micro-batches. The plan's own settings
    # beside it, for the option's effect at that batch.
    Configuration("largest-ds3-13b-accumulate-32", "deepspeed_stage_3", "13b", micro_batch=8, planned="partial",
                  activation_checkpointing=True, same_batch=True, accumulate=32),
    Configuration("largest-ds3-13b-accumulate-32-on-gpu", "deepspeed_stage_3", "13b", micro_batch=8,
                  planned="partial", activation_checkpointing=True, same_batch=True, accumulate=32,
                  tuning={"offloaded_gradients_on_gpu": True}),
    # The largest DeepSpeed's plan fits on one H200 as detected (139 GiB, 125 GiB of host memory), with no memory
    # given by hand: 13B needs about 20 bytes a parameter between GPU and host, more than the plan's margins leave.
    Configuration("largest-ds3-12b-accumulate-8", "deepspeed_stage_3", "12b", micro_batch=8, planned="partial",
                  activation_checkpointing=True, same_batch=True, accumulate=8),
    # Twice the sequences a step, for the plan's larger share: Gemini's accumulation moves each offloaded chunk's
    # 16-bit copy and gradient between host and GPU every micro-batch, so a larger micro-batch is how it gets
    # more tokens per optimizer step.
    Configuration("largest-gemini-13b-mb32", "colossalai", "13b", micro_batch=32, precision="16-mixed",
                  planned="partial", activation_checkpointing=True, same_batch=True),
    # The largest Gemini's plan fits on one H200 as detected (139.8 GiB, 125.9 GiB of host memory), at 8 sequences
    # a step; at 16 it fits 14.4B, at 32 13.1B (largest-gemini-13b-mb32).
    Configuration("largest-gemini-15b", "colossalai", "15b", micro_batch=8, precision="16-mixed", planned="partial",
                  activation_checkpointing=True, same_batch=True),
    # The same search on one H100 (run with --gpu-memory 79): 13B fits no strategy there, 10.6B fits Gemini at up
    # to 24 sequences a step.
    Configuration("h100-gemini-10b-mb24", "colossalai", "10b", micro_batch=24, precision="16-mixed",
                  planned="partial", activation_checkpointing=True, same_batch=True),
    # DeepSpeed's part of the H100 search (--gpu-memory 79 --host-memory 125): the host bounds it, at 18 bytes
    # per offloaded parameter; 27 of 13b's blocks (9.0B) with 70% offloaded is the most the plan fits.
    Configuration("h100-ds3-9b-accumulate-8", "deepspeed_stage_3", "9b", micro_batch=8, planned="partial",
                  activation_checkpointing=True, same_batch=True, accumulate=8),
    # Lightning's built-in beside the largest (issue 13 asks for it in the same call): the same model, batches and
    # checkpointing as largest-ds3-13b-accumulate-8, with everything offloaded as its name says. Run with
    # --host-limit, which stops it before the machine's memory is gone.
    Configuration("builtin-ds3-offload-13b-accumulate-8", "lightning:deepspeed_stage_3_offload", "13b",
                  {"stage": 3, "offload_optimizer": True, "offload_parameters": True}, micro_batch=8,
                  activation_checkpointing=True, same_batch=True, accumulate=8),
]  # fmt: skip
# Four GPUs of one machine (4 x H200): the plan's peaks per GPU and per node, a model no single GPU holds, and two
# torchrun "nodes" of two GPUs each on the same machine (each node's host peak is measured apart).
FOUR_GPUS = [
    Configuration("fsdp-4x-1.3b", "fsdp", "1.3b", devices=4),
    Configuration("ds3-4x-1.3b", "deepspeed_stage_3", "1.3b", {"stage": 3}, devices=4),
    Configuration("gemini-cuda-4x-1.3b", "colossalai_cuda", "1.3b", devices=4),
    Configuration("fsdp-4x-20b", "fsdp", "20b", devices=4, activation_checkpointing=True),
    Configuration("ds3-4x-20b", "deepspeed_stage_3", "20b", {"stage": 3}, devices=4, activation_checkpointing=True),
    Configuration("gemini-cuda-4x-20b", "colossalai_cuda", "20b", devices=4, activation_checkpointing=True),
    Configuration("fsdp-2x2-6.7b", "fsdp", "6.7b", devices=2, nodes=2),
    Configuration("ds3-2x2-6.7b", "deepspeed_stage_3", "6.7b", {"stage": 3}, devices=2, nodes=2),
]
# What each sharding name's speed on four GPUs depends on (issue 30): the same 1.3B run with one setting changed.
# ZeRO-3's are DeepSpeed config keys, so they pass as a whole config (the strategy then builds none of its own).
_ZERO3 = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 200_000_000}
TUNING_4X = [
    Configuration("ds3-4x-1.3b-prefetch-2e8", "deepspeed_stage_3", "1.3b", {"stage": 3}, devices=4,
                  tuning={"config": {"zero_optimization": {**_ZERO3, "stage3_prefetch_bucket_size": 200_000_000},
                                     "zero_allow_untested_optimizer": True}}),
    Configuration("ds3-4x-1.3b-buckets-5e8", "deepspeed_stage_3", "1.3b", {"stage": 3}, devices=4,
                  tuning={"config": {"zero_optimization": {**_ZERO3, "stage3_prefetch_bucket_size": 500_000_000,
                                                           "reduce_bucket_size": 500_000_000,
                                                           "stage3_max_live_parameters": 3_000_000_000},
                                     "zero_allow_untested_optimizer": True}}),
    Configuration("ds3-4x-1.3b-no-overlap", "deepspeed_stage_3", "1.3b", {"stage": 3}, devices=4,
                  tuning={"config": {"zero_optimization": {**_ZERO3, "overlap_comm": False},
                                     "zero_allow_untested_optimizer": True}}),
    Configuration("gemini-cuda-4x-1.3b-pinned", "colossalai_cuda", "1.3b", devices=4, tuning={"pin_memory": True}),
    Configuration("gemini-cuda-4x-1.3b-prefetch-2", "colossalai_cuda", "1.3b", devices=4, tuning={"max_prefetch": 2}),
    Configuration("gemini-cuda-4x-1.3b-pinned-prefetch-2", "colossalai_cuda", "1.3b", devices=4,
                  tuning={"pin_memory": True, "max_prefetch": 2}),
]  # fmt: skip
# Training on the CPU (run with --accelerator cpu): the plan's CPU candidates, Lightning's own auto and ddp among
# them, on a machine without GPUs; short sequences keep a step within seconds on a few cores.
ON_CPU = [
    Configuration("cpu-auto-125m", "auto", "125m", micro_batch=2, length=256),
    Configuration("cpu-ddp-125m", "ddp", "125m", micro_batch=2, length=256, devices=2),
    Configuration("cpu-fsdp-125m", "fsdp", "125m", micro_batch=2, length=256, devices=2),
    Configuration("cpu-ds2-125m", "deepspeed_stage_2", "125m", {"stage": 2}, micro_batch=2, length=256, devices=2),
    Configuration("cpu-ds3-125m", "deepspeed_stage_3", "125m", {"stage": 3}, micro_batch=2, length=256, devices=2),
]
# Lightning's own names, passed to the Trainer as they are (no package of ours registers them).
LIGHTNING_NAMES = ("auto", "ddp")
BY_ID = {configuration.id: configuration for configuration in CONFIGURATIONS + LARGEST + FOUR_GPUS + TUNING_4X + ON_CPU}
# Small enough for a CPU run of the harness itself (no GPU peak is measured there).
CPU_SMOKE = Configuration("cpu-smoke", "fsdp", "tiny", micro_batch=2, length=64)


def optimizer_for(strategy: str, settings: dict[str, Any], accelerator: str = "cuda") -> str:
    """The optimizer the benchmark uses with each backend (tools/benchmark/optimizers.py's names); on the CPU,
    torch's (DeepSpeed's fused Adam is a CUDA kernel)."""
    if accelerator == "cpu":
        return "adamw_fused"
    if strategy.startswith("colossalai"):
        return "hybrid_adam"
    if strategy.startswith("deepspeed"):
        offloaded = settings.get("offload_optimizer") or strategy.endswith(("offload", "offload_nvme"))
        return "deepspeed_cpu_adam" if offloaded else "deepspeed_fused_adam"
    return "adamw_fused"


def with_tuning(settings: dict[str, Any], tuning: dict[str, Any]) -> dict[str, Any]:
    """The plan's settings with the tuning's; a tuning that says where the offloaded gradients accumulate
    replaces the plan's choice of that."""
    from lightning_strategies_deepspeed.defaults import GRADIENT_PLACEMENT

    if any(name in tuning for name in GRADIENT_PLACEMENT):
        settings = {name: value for name, value in settings.items() if name not in GRADIENT_PLACEMENT}
    return {**settings, **tuning}


def prediction(
    configuration: Configuration, gpu_memory_gib: float, host_memory_gib: float, accelerator: str = "cuda"
) -> dict[str, Any]:
    """The planner's candidate for this strategy and settings on the machine described (without GPUs for
    ``accelerator`` "cpu")."""
    from lightning_strategies.planning import GIB, Machine, Workload
    from lightning_strategies.planning.planner import plan_for

    size = SIZES[configuration.size]
    workload = Workload.build(
        None,
        layers=size.layers,
        hidden=size.width,
        heads=size.heads,
        vocabulary=VOCABULARY,
        sequence_length=configuration.length,
        micro_batch=configuration.micro_batch,
        precision=configuration.precision,
        activation_checkpointing=configuration.activation_checkpointing,
    )
    on_cpu = accelerator == "cpu"
    machine = Machine(
        0 if on_cpu else configuration.devices * configuration.nodes,
        0 if on_cpu else int(gpu_memory_gib * GIB),
        int(host_memory_gib * GIB),
        nodes=configuration.nodes,
    )
    result = plan_for(workload, machine)
    # Lightning's built-in is predicted as our strategy of the same name and settings: DeepSpeed gets the same config.
    ours = configuration.strategy.removeprefix(BUILTIN)
    same = [c for c in result.candidates if c.strategy == ours]
    if configuration.planned == "partial":
        # A share chosen in the settings (placement auto's share is decided at run time, with no settings).
        partial = [
            c
            for c in same
            if 0 < c.offloaded_fraction < 1 and c.settings and c.settings.get("offload_optimizer") is not True
        ]
        chosen = [c for c in partial if c.fits] or partial
    else:
        chosen = [c for c in same if c.settings == configuration.settings]
    if not chosen:
        raise SystemExit(
            f"{configuration.id}: the planner gave no {configuration.strategy} candidate with settings "
            f"{configuration.settings or configuration.planned}; its candidates: {[c.settings for c in same]}"
        )
    found = chosen[0].to_dict()
    from lightning_strategies_deepspeed.defaults import GRADIENT_PLACEMENT

    placement = {name: value for name, value in configuration.tuning.items() if name in GRADIENT_PLACEMENT}
    if placement and ours.startswith("deepspeed"):
        # Where ZeRO-3's offloaded gradients accumulate moves memory between GPU and host: predicted with the
        # plan's share, as the strategy runs it.
        from lightning_strategies.planning import fits_machine
        from lightning_strategies_deepspeed.memory import ZeroSetting, predict

        settings = with_tuning(found["settings"], placement)
        setting = ZeroSetting(settings["stage"], settings["offload_optimizer"])
        peaks = predict(workload, machine.gpus, setting, settings)
        found.update(
            gpu_peak_gib=round(peaks.gpu_bytes / GIB, 2),
            host_peak_gib=round(peaks.host_bytes / GIB, 2),
            fits=fits_machine(peaks.gpu_bytes, peaks.host_bytes, machine),
        )
    return found


def descendants(root: int) -> list[int]:
    """``root``, its children, theirs, ... (pids, from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and every process below it, the deepest first."""
    for pid in reversed(descendants(root)):
        with contextlib.suppress(OSError):  # it ended on its own meanwhile
            os.kill(pid, 9)


def status_fields(pid: int | str) -> dict[str, str]:
    """``/proc/<pid>/status`` (``pid`` may be ``"self"``) as ``field -> value``, e.g. ``"VmRSS" -> "1024 kB"``;
    OSError where the process has gone."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {name: value.strip() for name, value in (line.split(":", 1) for line in lines if ":" in line)}


def tree_rss(root: int, kind: str = "VmRSS") -> dict[str, int]:
    """Resident bytes of ``root`` and every process below it, now, by ``pid command``: all of them, or one ``kind``
    of /proc's status (``RssAnon``: what the processes hold; ``RssFile``: pages of files mapped in)."""
    found = {}
    for pid in descendants(root):
        try:
            fields = status_fields(pid)
        except OSError:  # it ended since the listing
            continue
        if kind in fields:
            # Anonymous, file-backed, shared and high-water resident kB: which kind of memory the peak is.
            kinds = "/".join(
                fields.get(kind, "? kB").split()[0] for kind in ("RssAnon", "RssFile", "RssShmem", "VmHWM")
            )
            name = f"{pid} {fields['Name']} anon/file/shmem/hwm kB {kinds}"
            found[name] = int(fields[kind].split()[0]) * 1024
    return found


class TreeSampler(threading.Thread):
    """The peak of the process tree's summed resident memory while it runs, and who held it then: a
    compiler or helper process beside the ranks counts too, and must be named to be told apart.

    With a ``limit`` (bytes) it kills the tree once the sum passes it: a configuration that would take all of
    the machine's memory is stopped and reported, instead of the kernel's OOM killer choosing what dies."""

    def __init__(self, root: int, interval: float = 0.2, limit: int | None = None, kind: str = "VmRSS") -> None:
        super().__init__(daemon=True)
        self.root, self.interval, self.peak, self.limit, self.kind = root, interval, 0, limit, kind
        self.at_peak: dict[str, int] = {}
        self.stopped_at: float | None = None  # seconds since start, where the limit stopped the tree
        # (seconds since start, GiB) about every second: with the stages, when the host filled up.
        self.timeline: list[tuple[float, float]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stopped.is_set():
            now = tree_rss(self.root, self.kind)
            if sum(now.values()) > self.peak:
                self.peak, self.at_peak = sum(now.values()), now
            elapsed = time.monotonic() - started
            if not self.timeline or elapsed - self.timeline[-1][0] >= 1.0:
                self.timeline.append((round(elapsed, 1), round(sum(now.values()) / 2**30, 2)))
            if self.limit is not None and sum(now.values()) > self.limit and self.stopped_at is None:
                self.stopped_at = round(elapsed, 1)
                kill_tree(self.root)
            self.stopped.wait(self.interval)

    def stop(self) -> int:
        self.stopped.set()
        self.join()
        return self.peak


def measure(
    configuration: Configuration,
    settings: dict[str, Any],
    steps: int,
    accelerator: str,
    timeout: float,
    host_limit: int | None = None,
):
    """One short fit in a fresh process tree: (per-device GPU peaks allocated, and reserved, host peak of the
    tree, each rank's resident memory by stage, rank 0's speed and losses, failure or None, seconds in where
    ``host_limit`` stopped it or None)."""
    with tempfile.TemporaryDirectory(prefix="memory-accuracy-") as scratch:
        spec = Path(scratch, "spec.json")
        spec.write_text(json.dumps({**dataclasses.asdict(configuration), "settings": settings, "steps": steps,
                                    "accelerator": accelerator, "results": scratch}))  # fmt: skip
        environment = {**os.environ, "PYTHONPATH": str(REPOSITORY) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        child_command = ["-m", "tools.benchmark.memory_accuracy", "--child", str(spec)]
        processes = [
            subprocess.Popen(
                [sys.executable, *launcher(configuration, node), *child_command],
                cwd=REPOSITORY,
                env={**environment, **node_devices(configuration, node, accelerator)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for node in range(configuration.nodes)
        ]
        # One sampler per node: host memory is what each node's processes hold, as the planner predicts it.
        samplers = [TreeSampler(process.pid, limit=host_limit) for process in processes]
        for sampler in samplers:
            sampler.start()
        outputs = read_outputs(processes, timeout)
        node_peaks = [sampler.stop() for sampler in samplers]
        node = max(range(len(node_peaks)), key=node_peaks.__getitem__)
        sampler, output = samplers[node], "\n".join(outputs)
        host_peak = node_peaks[node]
        if sampler.stopped_at is not None:
            output += (
                f"\nStopped by the harness {sampler.stopped_at} s in: the process tree's resident memory passed "
                f"--host-limit {host_limit / 2**30:.1f} GiB.\n"
            )
        print(json.dumps({"host_peak_by_process_gib": {k: round(v / 2**30, 2) for k, v in sampler.at_peak.items()}}))
        ranks = sorted(Path(scratch).glob("rank-*.json"))
        records = [json.loads(path.read_text()) for path in ranks]
        gpu_peaks = [record["max_memory_allocated"] for record in records]
        reserved = [record["max_memory_reserved"] for record in records]
        stages = [json.loads(path.read_text()) for path in sorted(Path(scratch).glob("stages-*.json"))]
        returned = all(launched.returncode == 0 for launched in processes)
        failure = None if returned and gpu_peaks else output[-3000:]
        if failure:
            print(json.dumps({"host_timeline_gib": sampler.timeline}))
        speed = records[0]["speed"] and {**records[0]["speed"], "phases": records[0]["phases"]} if records else None
        return gpu_peaks, reserved, host_peak, stages, speed, failure, sampler.stopped_at


def launcher(configuration: Configuration, node: int) -> list[str]:
    """The arguments before the child's module: none for one node (the Trainer starts the ranks), torchrun for
    each of several "nodes" on this machine."""
    if configuration.nodes == 1:
        return []
    return ["-m", "torch.distributed.run", f"--nnodes={configuration.nodes}", f"--node-rank={node}",
            f"--nproc-per-node={configuration.devices}", "--master-addr=127.0.0.1", "--master-port=29533"]  # fmt: skip


def node_devices(configuration: Configuration, node: int, accelerator: str) -> dict[str, str]:
    """Each "node" on this machine sees its own GPUs, as a node of its own would (NCCL refuses two ranks on one)."""
    if configuration.nodes == 1 or accelerator != "cuda":
        return {}
    first = node * configuration.devices
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(first + index) for index in range(configuration.devices))}


def read_outputs(processes: list[subprocess.Popen], timeout: float) -> list[str]:
    """Everything each of ``processes`` printed, one after another under one deadline ``timeout`` seconds from now:
    each later process gets only the time left, so a hung fit of several nodes ends in ``timeout``, not one per
    node."""
    deadline = time.monotonic() + timeout
    return [read_output(process, max(0.0, deadline - time.monotonic())) for process in processes]


def read_output(process: subprocess.Popen, timeout: float) -> str:
    """Everything ``process`` printed, killing its tree at ``timeout`` seconds."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        output, _ = process.communicate()
    return output


def resident_gib() -> tuple[float, float]:
    """(resident now, peak resident so far) of this process in GiB."""
    import resource

    now_kib = int(status_fields("self")["VmRSS"].split()[0])
    return now_kib / 2**20, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def host_stages_callback(path: Path) -> Any:
    """A callback that notes this rank's resident memory as training sets up: where the host peak is reached
    (before the model, after configure_model and the strategy's setup, around the first step's backward and
    optimizer step) tells which term of the planner's host prediction is off. Written to ``path`` at each
    stage, so a rank killed for host memory still says how far it got."""
    from lightning.pytorch.callbacks import Callback

    class HostStages(Callback):
        def __init__(self) -> None:
            self.stages: dict[str, tuple[float, float]] = {}
            self.note("before_trainer")

        def note(self, stage: str) -> None:
            if stage not in self.stages:
                self.stages[stage] = resident_gib()
                # Replaced whole, so a rank killed while writing leaves the previous stages readable.
                partial = path.with_suffix(".partial")
                partial.write_text(json.dumps(self.stages))
                os.replace(partial, path)

        def setup(self, trainer: Any, module: Any, stage: str) -> None:
            self.note("before_configure_model")

        def on_fit_start(self, trainer: Any, module: Any) -> None:
            self.note("after_strategy_setup")

        def on_before_zero_grad(self, trainer: Any, module: Any, optimizer: Any) -> None:
            self.note("after_first_forward")  # Lightning zeroes gradients between forward and backward

        def on_after_backward(self, trainer: Any, module: Any) -> None:
            self.note("after_first_backward")

        def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
            self.note("before_first_optimizer_step")

        def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            if trainer.global_step >= 1:  # with accumulation, the first micro-batches end before any step
                self.note("after_first_step")

        def on_train_end(self, trainer: Any, module: Any) -> None:
            self.note("end")

    return HostStages()


def phase_times_callback() -> Any:
    """A callback that splits each optimizer step's wall time into its micro-batches' forward and backward and
    the optimizer step itself (synchronised, so GPU work is counted where it is queued): with an offloaded
    optimizer the second is paid once per optimizer step, and how the two compare says what accumulation
    or a larger micro-batch buys in MFU."""
    import torch
    from lightning.pytorch.callbacks import Callback

    def now() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    class PhaseTimes(Callback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []
            self.forward_backward = 0.0
            self.started = self.stepping = 0.0

        def on_train_batch_start(self, *arguments: Any) -> None:
            self.started = now()

        def on_before_optimizer_step(self, *arguments: Any) -> None:
            self.stepping = now()

        def on_train_batch_end(self, trainer: Any, *arguments: Any) -> None:
            ended = now()
            if self.stepping > self.started:  # this micro-batch ended with an optimizer step
                self.forward_backward += self.stepping - self.started
                self.steps.append({"forward_backward_s": self.forward_backward, "optimizer_s": ended - self.stepping})
                self.forward_backward = 0.0
            else:
                self.forward_backward += ended - self.started

    return PhaseTimes()


def child(spec_path: Path) -> None:
    """Inside the measured tree: build the strategy from the registry with the settings, fit, record."""
    import torch
    from lightning.pytorch import Trainer

    from lightning_strategies import get_registry
    from tools.benchmark.lightning_runs import GPTModule, RecordSteps, builtin_strategy
    from tools.benchmark.measure import RandomTokens, Workload, rank

    spec = json.loads(spec_path.read_text())
    workload = Workload(
        run=spec["strategy"] if spec["strategy"].startswith(BUILTIN) else f"trainer:{spec['strategy']}",
        size=spec["size"],
        batch_size=spec["micro_batch"],
        length=spec["length"],
        warmup_steps=spec["accumulate"],  # the first optimizer step's micro-batches
        timed_steps=(spec["steps"] - 1) * spec["accumulate"],
        devices=spec["devices"],
        accelerator=spec["accelerator"],
        activation_checkpointing=spec["activation_checkpointing"],
    )
    name = spec["strategy"]
    if name.startswith(BUILTIN):  # its settings are those its name stands for
        strategy = builtin_strategy(name.removeprefix(BUILTIN))
    elif name in LIGHTNING_NAMES:
        strategy = name
    else:
        strategy = get_registry().resolve(name, **with_tuning(spec["settings"], spec["tuning"]))
    stages = host_stages_callback(Path(spec["results"], f"stages-{rank()}.json"))
    steps = RecordSteps(workload)  # speed and the loss of every step, as the benchmark's runs record them
    phases = phase_times_callback()
    trainer = Trainer(
        callbacks=[stages, steps, phases],
        accelerator=spec["accelerator"],
        devices=spec["devices"],
        num_nodes=spec["nodes"],
        strategy=strategy,
        precision=spec["precision"],
        max_steps=spec["steps"],
        accumulate_grad_batches=spec["accumulate"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    data = RandomTokens(workload)
    if spec["same_batch"]:
        data = torch.utils.data.Subset(data, [i % workload.batch_size for i in range(len(data))])
    loader = torch.utils.data.DataLoader(data, batch_size=workload.batch_size)
    optimizer = optimizer_for(name.removeprefix(BUILTIN), spec["settings"], spec["accelerator"])
    trainer.fit(GPTModule(workload, optimizer), loader)
    device = trainer.strategy.root_device
    on_gpu = device.type == "cuda"
    # Reserved beside allocated: what the caching allocator held, the evidence for the planner's fragmentation
    # share and choice margin near a full GPU.
    allocated = torch.cuda.max_memory_allocated(device) if on_gpu else None
    reserved = torch.cuda.max_memory_reserved(device) if on_gpu else None
    # The stages are in their own file already (written as each was reached).
    record = {"rank": trainer.global_rank, "device": str(device), "max_memory_allocated": allocated,
              "max_memory_reserved": reserved, "speed": speed(steps), "phases": phases.steps}  # fmt: skip
    Path(spec["results"], f"rank-{trainer.global_rank}.json").write_text(json.dumps(record))


def speed(steps: Any) -> dict[str, Any] | None:
    """tokens/s, MFU and every micro-batch's loss (None where fewer than two steps ran); seconds_per_step is per
    micro-batch."""
    if steps.recorder is None or steps.workload.timed_steps < 1:
        return None
    result = steps.recorder.result()
    return {key: result[key] for key in ("tokens_per_second", "seconds_per_step", "mfu", "losses", "finite_loss")}


def compare(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured, or None where either is missing."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def markdown(records: list[dict[str, Any]]) -> str:
    lines = [
        "| configuration | strategy | settings | GPU predicted | GPU measured | error | host predicted | "
        "host measured | error | within 10% |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]

    def gib(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} GiB"

    def error(value: float | None) -> str:
        return "-" if value is None else f"{value:+.0%}"

    for record in records:
        if record.get("failure"):
            lines.append(f"| {record['id']} | {record['strategy']} | | | failed | | | | | no |")
            continue
        lines.append(
            f"| {record['id']} | {record['strategy']} | {json.dumps(record['settings'])} | "
            f"{gib(record['gpu_predicted_gib'])} | {gib(record['gpu_measured_gib'])} | {error(record['gpu_error'])} | "
            f"{gib(record['host_predicted_gib'])} | {gib(record['host_measured_gib'])} | "
            f"{error(record['host_error'])} | {'yes' if record['within_tolerance'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def run(configurations: list[Configuration], arguments: argparse.Namespace) -> list[dict[str, Any]]:
    # Where, when and at which commit: docs/results keeps these records, and the plots take each id's latest.
    facts = environment.collect()
    measured_on = {
        "device": f"{facts['device_count']} x {facts['device']}" if facts["device"] else "cpu",
        "date": facts["date"],
        "git_commit": facts["git_commit"],
        "python": facts["python"],
        "versions": facts["versions"],
        "environment": environment.recorded_settings(),
    }
    records = []
    for configuration in configurations:
        predicted = prediction(configuration, arguments.gpu_memory, arguments.host_memory, arguments.accelerator)
        limit = None if arguments.host_limit is None else int(arguments.host_limit * 2**30)
        gpu_peaks, reserved, host_peak, host_stages, speed, failure, stopped_at = measure(
            configuration, predicted["settings"], arguments.steps, arguments.accelerator, arguments.timeout, limit
        )
        gpu_measured = max(gpu_peaks) / 2**30 if gpu_peaks and None not in gpu_peaks else None
        host_measured = host_peak / 2**30
        gpu_error = compare(predicted["gpu_peak_gib"], gpu_measured)
        # A tree stopped at the limit had not reached its peak: there is no error to state.
        host_error = None if stopped_at is not None else compare(predicted["host_peak_gib"], host_measured)
        errors = [abs(value) for value in (gpu_error, host_error) if value is not None]
        record = {
            **dataclasses.asdict(configuration),
            "settings": predicted["settings"],
            "predicted_fits": predicted["fits"],
            "gpu_predicted_gib": predicted["gpu_peak_gib"],
            "gpu_measured_gib": gpu_measured,
            "gpu_measured_per_device_gib": [peak / 2**30 for peak in gpu_peaks if peak is not None],
            "gpu_reserved_per_device_gib": [peak / 2**30 for peak in reserved if peak is not None],
            "gpu_error": gpu_error,
            "host_predicted_gib": predicted["host_peak_gib"],
            "host_measured_gib": host_measured,
            "host_error": host_error,
            "stopped_at_host_limit_seconds": stopped_at,
            "host_stages_per_rank_gib": host_stages,
            "speed": speed,
            # On the CPU there is no GPU peak: the host's is the whole prediction.
            "within_tolerance": failure is None
            and len(errors) == (1 if arguments.accelerator == "cpu" else 2)
            and max(errors) <= TOLERANCE,
            "failure": failure,
            **measured_on,
        }
        records.append(record)
        shown = {key: record[key] for key in ("id", "gpu_error", "host_error", "within_tolerance")}
        print(json.dumps({**shown, "failed": failure is not None}), flush=True)
        arguments.out.mkdir(parents=True, exist_ok=True)
        (arguments.out / "memory-accuracy.json").write_text(json.dumps(records, indent=1) + "\n")
        (arguments.out / "memory-accuracy.md").write_text(markdown(records))
    return records


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m tools.benchmark.memory_accuracy", description=__doc__.split("\n")[0])
    main.add_argument("--out", type=Path, default=Path("memory-accuracy"), help="folder for the JSON and table")
    main.add_argument("--only", help="comma-separated configuration ids (see --list)")
    main.add_argument("--list", action="store_true", help="print the configurations and exit")
    main.add_argument("--steps", type=int, default=3, help="training steps per fit (peaks come in the first)")
    main.add_argument("--accelerator", default="cuda", choices=["cuda", "cpu"])
    main.add_argument("--gpu-memory", type=float, default=139.0, help="GiB per GPU the prediction assumes")
    main.add_argument("--host-memory", type=float, default=128.0, help="GiB of host memory the prediction assumes")
    main.add_argument("--timeout", type=float, default=540, help="seconds one fit may take")
    main.add_argument("--host-limit", type=float, help="GiB of resident memory at which a fit is stopped")
    main.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    main.add_argument("--cpu-smoke", action="store_true", help="the tiny CPU configuration (tests the harness)")
    return main


def main(argv: list[str] | None = None) -> None:
    arguments = parser().parse_args(argv)
    if arguments.child:
        child(arguments.child)
        return
    if arguments.list:
        for configuration in BY_ID.values():
            nodes = f"{configuration.nodes}x" if configuration.nodes > 1 else ""
            count = f"{nodes}{configuration.devices}"
            print(f"{configuration.id:40} {configuration.strategy:28} {configuration.size:6} x{count}")
        return
    if arguments.cpu_smoke:
        chosen = [CPU_SMOKE]
    elif arguments.only:
        chosen = [BY_ID[name.strip()] for name in arguments.only.split(",")]
    else:
        chosen = CONFIGURATIONS
    run(chosen, arguments)


if __name__ == "__main__":
    main()
