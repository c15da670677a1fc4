"""The machine a plan is for: its nodes, GPUs and host memory (per node), read from this one and from torchrun's
or SLURM's environment, or given, and how much of each a training run can use."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from lightning_strategies.planning.fitted import FITTED

CUDA_CONTEXT_BYTES = int(FITTED["CUDA_CONTEXT_BYTES"].value)
ALLOCATOR_FRAGMENTATION = FITTED["ALLOCATOR_FRAGMENTATION"].value
HOST_HEADROOM = FITTED["HOST_HEADROOM"].value

# Stated, not modelled: the plan predicts memory, never step time, and says what it takes the network to be.
INTER_NODE_ASSUMPTION = (
    "between nodes the plan assumes a data-centre network of about 200 Gbit/s per node (InfiniBand or RoCE); it "
    "predicts memory, not speed: over a slower link a strategy that shards across nodes (fsdp, ZeRO-3, Gemini) "
    "spends much of each step communicating"
)


@dataclasses.dataclass(frozen=True)
class Machine:
    """The devices a run trains on: ``gpus`` in all (memory each), spread evenly over ``nodes``; each node's host
    memory and NVMe space for offloading. ``gpus`` 0 is a machine without GPUs: training on its CPU."""

    gpus: int
    gpu_memory_bytes: int
    host_memory_bytes: int  # of each node
    nvme_bytes: int = 0  # of each node
    detected: tuple[str, ...] = ()  # which fields were read from this machine or its environment, not given
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus % self.nodes:
            raise ValueError(f"{self.gpus} GPUs do not spread evenly over {self.nodes} node(s).")

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def processes_per_node(self) -> int:
        """Training processes on one node, whose host memory a prediction's ``host_bytes`` counts: one per GPU."""
        return max(1, self.gpus_per_node)

    @property
    def gpu_budget_bytes(self) -> int:
        """What torch's allocator can hand out per GPU: the card less the CUDA context and fragmentation."""
        return int((self.gpu_memory_bytes - CUDA_CONTEXT_BYTES) * (1 - ALLOCATOR_FRAGMENTATION))

    @property
    def host_budget_bytes(self) -> int:
        return int(self.host_memory_bytes * (1 - HOST_HEADROOM))

    @classmethod
    def detect(
        cls,
        gpus: int | None = None,
        gpu_memory_bytes: int | None = None,
        host_memory_bytes: int | None = None,
        nvme_bytes: int = 0,
        nodes: int = 1,
    ) -> Machine:
        """This machine, with any field given overriding what is found; ``gpus`` counts every node's, and where it is
        not given, ``nodes`` of this one's."""
        detected = []
        if gpus is None or gpu_memory_bytes is None:
            found_gpus, found_memory = _cuda_devices()
            if gpus is None:
                gpus = found_gpus * nodes
                detected.append("gpus")
            if gpu_memory_bytes is None:
                gpu_memory_bytes = found_memory
                detected.append("gpu_memory")
        if host_memory_bytes is None:
            host_memory_bytes = host_memory()
            detected.append("host_memory")
        return cls(gpus, gpu_memory_bytes, host_memory_bytes, nvme_bytes, tuple(detected), nodes)


def launcher_layout(environ: Mapping[str, str]) -> tuple[int, int, str] | None:
    """(nodes, GPUs per node, launcher) read from torchrun's (WORLD_SIZE, LOCAL_WORLD_SIZE) or SLURM's
    (SLURM_NNODES with SLURM_NTASKS_PER_NODE or SLURM_GPUS_ON_NODE) environment, or None outside both."""

    def number(name: str) -> int | None:
        # SLURM writes repeated counts as "8(x2)"; every node of a plan has the same count.
        text = environ.get(name, "").split("(")[0].split(",")[0].strip()
        return int(text) if text.isdigit() and int(text) > 0 else None

    world, local = number("WORLD_SIZE"), number("LOCAL_WORLD_SIZE")
    if world and local and world % local == 0:
        return world // local, local, "torchrun"
    nodes = number("SLURM_NNODES")
    per_node = number("SLURM_NTASKS_PER_NODE") or number("SLURM_GPUS_ON_NODE")
    if nodes and per_node:
        return nodes, per_node, "SLURM"
    return None


def _cuda_devices() -> tuple[int, int]:
    """(count, memory of the smallest) of the CUDA devices, or (0, 0) without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return 0, 0
    if not torch.cuda.is_available():
        return 0, 0
    count = torch.cuda.device_count()
    memory = min(torch.cuda.get_device_properties(index).total_memory for index in range(count))
    return count, memory


MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
# A cgroup's memory limit, what its processes use now (page cache included), and where its page cache not in use
# now (which the kernel reclaims before killing) is counted: version 2's files, then version 1's.
_CGROUP_FILES = (
    ("memory.max", "memory.current", "memory.stat", "inactive_file"),
    ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat", "total_inactive_file"),
)


def host_memory(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int:
    """Host memory this process may use: MemTotal, or a container's cgroup limit where lower."""
    total = _meminfo_bytes(meminfo, "MemTotal")
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 0
    for limit, _ in _cgroup_limits(cgroup):
        if total == 0 or limit < total:
            total = limit
    return total


def available_memory(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int | None:
    """Host memory this process can take now without swapping or being killed: MemAvailable, or what is left under a
    container's cgroup limit where less (its inactive page cache counted as free, as the kernel would reclaim it);
    None where neither is known."""
    available = _meminfo_bytes(meminfo, "MemAvailable")
    for limit, used in _cgroup_limits(cgroup):
        if used is not None and (available is None or limit - used < available):
            available = max(limit - used, 0)
    return available


def _meminfo_bytes(meminfo: Path, field: str) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_limits(cgroup: Path) -> list[tuple[int, int | None]]:
    """(limit, use now less reclaimable page cache, or None) of each cgroup memory limit set ("max" is none)."""
    found = []
    for limit_name, usage_name, stat_name, inactive_name in _CGROUP_FILES:
        try:
            limit = (cgroup / limit_name).read_text().strip()
        except OSError:
            continue
        if not limit.isdigit():
            continue
        try:
            used: int | None = int((cgroup / usage_name).read_text().strip())
        except (OSError, ValueError):
            used = None
        if used is not None:
            used -= _stat_bytes(cgroup / stat_name, inactive_name)
        found.append((int(limit), used))
    return found


def _stat_bytes(path: Path, field: str) -> int:
    """One field of a cgroup's memory.stat (bytes), 0 where absent."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == field and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0
