"""The machine a plan is for: its GPUs and host memory, read from this one or given, and how much of each a
training run can use."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from lightning_strategies.planning.fitted import FITTED

CUDA_CONTEXT_BYTES = int(FITTED["CUDA_CONTEXT_BYTES"].value)
ALLOCATOR_FRAGMENTATION = FITTED["ALLOCATOR_FRAGMENTATION"].value
HOST_HEADROOM = FITTED["HOST_HEADROOM"].value


@dataclasses.dataclass(frozen=True)
class Machine:
    """The devices one node offers: GPUs (count and memory each), host memory, NVMe space for offloading."""

    gpus: int
    gpu_memory_bytes: int
    host_memory_bytes: int
    nvme_bytes: int = 0
    detected: tuple[str, ...] = ()  # which fields were read from this machine, not given

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
    ) -> Machine:
        """This machine, with any field given overriding what is found."""
        detected = []
        if gpus is None or gpu_memory_bytes is None:
            found_gpus, found_memory = _cuda_devices()
            if gpus is None:
                gpus = found_gpus
                detected.append("gpus")
            if gpu_memory_bytes is None:
                gpu_memory_bytes = found_memory
                detected.append("gpu_memory")
        if host_memory_bytes is None:
            host_memory_bytes = host_memory()
            detected.append("host_memory")
        return cls(gpus, gpu_memory_bytes, host_memory_bytes, nvme_bytes, tuple(detected))


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


def host_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Host memory this process may use: MemTotal, or a container's cgroup limit where lower."""
    total = 0
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except OSError:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 0
    for limit_file in (cgroup / "memory.max", cgroup / "memory" / "memory.limit_in_bytes"):
        try:
            text = limit_file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total == 0 or int(text) < total):
            total = int(text)
    return total
