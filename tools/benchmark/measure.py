"""What every run shares: the workload, its data, and how time, memory and loss are recorded."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import re
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tools.benchmark.model import training_flops_per_token
from tools.benchmark.sizes import SIZES, VOCABULARY, parameter_count

LEARNING_RATE = 1e-4
GC_FREEZE = "BENCHMARK_GC_FREEZE"  # set by the "gc_frozen" variant (catalogue.VARIANTS)


@dataclasses.dataclass(frozen=True)
class Workload:
    run: str
    size: str = "1.3b"
    batch_size: int = 8  # sequences per device and step
    length: int = 1024  # tokens per sequence
    warmup_steps: int = 4
    timed_steps: int = 12
    devices: int = 1
    accelerator: str = "cuda"
    # Where the run saves its checkpoint after the last step (a scratch folder the harness deletes);
    # None: no checkpoint.
    checkpoint_dir: str | None = None
    activation_checkpointing: bool = False  # every block recomputed in backward (model FLOPs still count once)

    @property
    def steps(self) -> int:
        return self.warmup_steps + self.timed_steps


class RandomTokens(torch.utils.data.Dataset):
    """Sequence i is drawn from a generator seeded with i: the same data in every run, whichever loader,
    sampler or process hands it out. Each item holds length + 1 tokens (inputs and shifted targets)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def __len__(self) -> int:
        return self.workload.steps * self.workload.devices * self.workload.batch_size

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(index)
        return torch.randint(0, VOCABULARY, (self.workload.length + 1,), generator=generator)


class Recorder:
    """Collects the loss of every step, times the steps after warm-up, then the checkpoint save.

    The device is synchronised only when the last warm-up step and the last timed step end, so
    the timed steps overlap host and device work as a training loop would. What could make one
    run slower than the next is recorded over the timed steps as well: the host-side time of each
    step (a stall shows as one long step, a uniform slow-down as all steps longer), the time
    Python's garbage collector ran, and the CUDA allocator's device allocations, frees and retries.
    """

    def __init__(self, workload: Workload, device: torch.device) -> None:
        self.workload, self.device = workload, device
        self.losses: list[torch.Tensor] = []
        self.started = self.stopped = 0.0
        self.step_ends: list[float] = []
        self.peaks: dict[str, int | None] = {}
        self.gc_seconds, self.gc_collections, self._gc_began = 0.0, 0, 0.0
        self.allocator_before: dict[str, int] = {}
        self.allocator: dict[str, int] = {}
        self.checkpoint: dict[str, Any] = {}
        # The host's 1-minute load when timing starts and the GPU's SM clock when it ends: a busy host or a
        # throttled GPU, told apart from a slower program.
        self.host: dict[str, Any] = {}
        self.usage_before: dict[str, float] = {}

    def step_ended(self, loss: torch.Tensor) -> None:
        self.losses.append(loss.detach().float().reshape(()).clone())
        if len(self.losses) == self.workload.warmup_steps:
            self._synchronize()
            if os.environ.get(GC_FREEZE) == "1":
                # The "gc_frozen" variant: what set-up left behind is collected once and never
                # scanned again, so a collection during the timed steps walks only the new objects.
                gc.collect()
                gc.freeze()
            self.allocator_before = allocator_counts(self.device)
            self.host = {"load_average": os.getloadavg()[0], "usable_cpus": len(os.sched_getaffinity(0))}
            gc.callbacks.append(self._gc_event)
            self.usage_before = cpu_usage()
            self.started = time.perf_counter()
            self.step_ends = [self.started]
        elif len(self.losses) > self.workload.warmup_steps:
            if len(self.losses) == self.workload.steps:
                self._synchronize()
            self.step_ends.append(time.perf_counter())
            if len(self.losses) == self.workload.steps:
                self.stopped = self.step_ends[-1]
                # First, before the readings below spend CPU time outside the timed steps.
                self.host.update(cpu_usage_since(self.usage_before, self.stopped - self.started))
                gc.callbacks.remove(self._gc_event)
                after = allocator_counts(self.device)
                self.allocator = {key: after[key] - self.allocator_before.get(key, 0) for key in after}
                self.peaks = memory_peaks(self.device)
                self.host["gpu_clock_mhz"] = gpu_clock(self.device)

    def _gc_event(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._gc_began
            self.gc_collections += 1

    def checkpoint_saved(self, began: float, ended: float, path: str | None) -> None:
        """The checkpoint save that followed the last step: from ``began`` until every rank had written."""
        self.checkpoint = {
            "checkpoint_seconds": ended - began,
            "end_to_end_seconds": ended - self.started,
            "checkpoint_bytes": folder_bytes(path) if path else None,
        }

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def result(self) -> dict[str, Any]:
        workload = self.workload
        if len(self.losses) != workload.steps:
            raise RuntimeError(f"{len(self.losses)} steps ran, {workload.steps} were asked for.")
        if workload.checkpoint_dir and not self.checkpoint:
            raise RuntimeError(f"No checkpoint was saved under {workload.checkpoint_dir} after the last step.")
        losses = [float(loss) for loss in self.losses]
        seconds = self.stopped - self.started
        tokens = workload.batch_size * workload.length * workload.devices * workload.timed_steps
        tokens_per_second = tokens / seconds
        size = SIZES[workload.size]
        flops_per_token = training_flops_per_token(size, workload.length)
        peak = peak_bf16_flops(device_name(self.device))
        end_to_end = self.checkpoint.get("end_to_end_seconds")
        return {
            "tokens_per_second": tokens_per_second,
            "seconds_per_step": seconds / workload.timed_steps,
            "flops_per_token": flops_per_token,
            "mfu": flops_per_token * tokens_per_second / (peak * workload.devices) if peak else None,
            "final_loss": losses[-1],
            "losses": losses,
            "finite_loss": all(math.isfinite(loss) for loss in losses),
            "step_seconds": [
                later - earlier for earlier, later in zip(self.step_ends, self.step_ends[1:], strict=False)
            ],
            "gc_seconds": self.gc_seconds,
            "gc_collections": self.gc_collections,
            "allocator": self.allocator,
            **self.host,
            "checkpoint_seconds": self.checkpoint.get("checkpoint_seconds"),
            "checkpoint_bytes": self.checkpoint.get("checkpoint_bytes"),
            "end_to_end_seconds": end_to_end,
            # The timed steps' tokens over the timed steps plus the save: what a run that ends with a
            # checkpoint gets per second of wall time.
            "tokens_per_second_with_checkpoint": tokens / end_to_end if end_to_end else None,
            **self.peaks,
        }


def allocator_counts(device: torch.device) -> dict[str, int]:
    """cudaMalloc and cudaFree calls of PyTorch's caching allocator so far, and its retries (a retry frees
    every cached block, which synchronises the device)."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {
        "device_allocations": int(stats.get("num_device_alloc", 0)),
        "device_frees": int(stats.get("num_device_free", 0)),
        "allocation_retries": int(stats.get("num_alloc_retries", 0)),
    }


def cpu_usage(process_first: bool = True) -> dict[str, float]:
    """CPU seconds and context switches so far, of the calling thread (the training loop's) and the process.

    The two are read one after the other: read the process first at the start of an interval and last at its end
    (``process_first=False``), so that the process's interval holds the thread's and its CPU seconds are never
    fewer (reading the thread first at the start gave a thread 2 ms more than its process, in CI)."""
    if process_first:
        process, thread = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD)
    else:
        thread, process = resource.getrusage(resource.RUSAGE_THREAD), resource.getrusage(resource.RUSAGE_SELF)
    return {
        "main_thread_cpu_seconds": thread.ru_utime + thread.ru_stime,
        "process_cpu_seconds": process.ru_utime + process.ru_stime,
        "main_thread_voluntary_switches": thread.ru_nvcsw,
        "main_thread_involuntary_switches": thread.ru_nivcsw,
    }


def cpu_usage_since(before: dict[str, float], wall_seconds: float) -> dict[str, float]:
    """What the timed steps cost the CPU. A training loop whose thread is busy for nearly all of the wall time
    is bound by the host, not the GPU: its speed then follows the core it runs on (involuntary switches count
    the times the scheduler took that core away)."""
    after = cpu_usage(process_first=False)
    spent = {key: after[key] - before[key] for key in after}
    return {**spent, "main_thread_busy": spent["main_thread_cpu_seconds"] / wall_seconds}


def gpu_clock(device: torch.device) -> int | None:
    """The SM clock now, in MHz (through NVML; None where it cannot be read)."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:  # NVML missing or refused: the clock is a diagnostic, never a reason to fail a run
        return None


def folder_bytes(path: str) -> int:
    """Bytes of a checkpoint file, or of every file in a checkpoint folder."""
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    return sum(item.stat().st_size for item in root.rglob("*") if item.is_file())


def memory_peaks(device: torch.device) -> dict[str, int | None]:
    """Peak GPU memory (allocated and reserved by PyTorch's allocator) and peak host RSS, the largest
    over all processes of the run."""
    peaks = [
        torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
        torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0,
        host_peak_rss(),
    ]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        on = device if dist.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor(peaks, dtype=torch.int64, device=on)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        peaks = tensor.tolist()
    gpu = device.type == "cuda"
    return {
        "peak_gpu_allocated_bytes": peaks[0] if gpu else None,
        "peak_gpu_reserved_bytes": peaks[1] if gpu else None,
        "peak_host_rss_bytes": peaks[2],
    }


def host_peak_rss() -> int:
    """This process's peak resident set (VmHWM), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


# Dense bf16 tensor-core peaks (no sparsity) from NVIDIA's data sheets, matched against
# torch.cuda.get_device_name(). Unknown devices get no MFU rather than a guessed one.
PEAK_BF16_FLOPS = [
    (r"H200", 989e12),
    (r"H100.*(SXM|HBM3)", 989e12),
    (r"H100.*NVL", 835e12),
    (r"H100.*PCIe", 756e12),
    (r"A100", 312e12),
]


def peak_bf16_flops(name: str) -> float | None:
    for pattern, flops in PEAK_BF16_FLOPS:
        if re.search(pattern, name):
            return flops
    return None


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def describe(workload: Workload) -> dict[str, Any]:
    size = SIZES[workload.size]
    return {
        **dataclasses.asdict(workload),
        "layers": size.layers,
        "width": size.width,
        "heads": size.heads,
        "parameters": parameter_count(size, workload.length),
    }


def rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def classify_failure(message: str, return_code: int | None = None) -> str:
    """The reason a run failed, in the terms --search-largest reports."""
    if "CUDA out of memory" in message or "OutOfMemoryError" in message:
        return "oom_gpu"
    if "DefaultCPUAllocator" in message or "annot allocate memory" in message or "can't allocate memory" in message:
        return "oom_host"
    if return_code == -9 or "exitcode: -9" in message or "SIGKILL" in message:
        return "killed_host_memory"
    if return_code == 124:
        return "timeout"
    return "other"
