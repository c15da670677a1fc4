"""Core's fitted constants, in one table that points at the measurements they came from.

Memory a process uses that no model predicts (the CUDA context, the allocator's caching, the host process
itself) and the per-token activation counts every package's model shares. Each package keeps its own
table of the same kind (``FITTED`` in its memory module), so that a reader checks a constant against its
evidence in one place and a refit changes one line.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path

GIB = 2**30

# Where the memory model's predictions are set against GPU measurements, constant by constant.
ACCURACY_TABLE = "docs/which-strategy.md#predicted-against-measured"


@dataclasses.dataclass(frozen=True)
class Fitted:
    """One constant of a memory model, what it stands for, and the evidence it was fitted to.

    ``evidence`` names files under docs/results/ or documentation sections (``page.md#heading``),
    relative to the repository root. A constant with none of its own measurement is an estimate: its
    evidence is where its predictions are compared with measurements.
    """

    value: float
    meaning: str
    evidence: tuple[str, ...]


FITTED: dict[str, Fitted] = {
    "CUDA_CONTEXT_BYTES": Fitted(
        0.75 * GIB,
        "device memory outside torch's allocator (kernels, cuBLAS workspaces): not in max_memory_allocated, "
        "but not usable by it either",
        (ACCURACY_TABLE,),
    ),
    "ALLOCATOR_FRAGMENTATION": Fitted(
        0.08, "the share of a device the caching allocator reserves beyond what it hands out", (ACCURACY_TABLE,)
    ),
    "HOST_PROCESS_BASE_BYTES": Fitted(
        2.0 * GIB,
        "resident memory of one training process without model state on the host (torch, CUDA, Lightning)",
        ("docs/results/2026-11-23-h200-memory-accuracy-1x.json",),
    ),
    "HOST_HEADROOM": Fitted(
        0.08, "the share of host memory left to the kernel, the page cache and other processes", (ACCURACY_TABLE,)
    ),
    "EXPANDABLE_SEGMENTS_BELOW_BYTES": Fitted(
        15 * GIB,
        "free GPU memory below which a plan advises expandable segments: a Gemini plan with less ran out of "
        "memory to fragmentation and trained with them",
        ("docs/results/2026-11-23-h100-memory-accuracy-largest-1x.json",),
    ),
    "ACTIVATION_BYTES_PER_TOKEN_WIDTH": Fitted(
        34,
        "activations of a GPT block per token and unit of width in 16-bit: Korthikanti et al. 2022 without the "
        "s x s attention terms, which fused attention kernels do not store",
        (ACCURACY_TABLE,),
    ),
    "LOGITS_BYTES_PER_TOKEN_ENTRY": Fitted(
        10,
        "output logits per token and vocabulary entry: the low-precision logits, their fp32 copy for the loss "
        "and the loss's fp32 gradient",
        (ACCURACY_TABLE,),
    ),
}


def unfound_evidence(table: Mapping[str, Fitted], repository: Path) -> list[str]:
    """Each ``name: evidence`` of ``table`` that names no file, page or heading under ``repository``."""
    missing = []
    for name, fitted in table.items():
        for evidence in fitted.evidence:
            page, _, section = evidence.partition("#")
            path = repository / page
            if not path.is_file() or (section and section not in _anchors(path)):
                missing.append(f"{name}: {evidence}")
    return missing


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as the documentation site makes them."""
    anchors = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors
