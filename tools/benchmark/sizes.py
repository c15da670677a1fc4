"""Model sizes by name, kept free of torch so that listing and reporting run without it."""

from __future__ import annotations

import dataclasses

VOCABULARY = 50304  # GPT-2's 50257 rounded up to a multiple of 128, the usual choice for speed


@dataclasses.dataclass(frozen=True)
class Size:
    layers: int
    width: int
    heads: int


# GPT-3 paper sizes (and GPT-NeoX-20B for 20b); "tiny" exists so the harness runs on CPU in tests.
SIZES: dict[str, Size] = {
    "tiny": Size(2, 128, 4),
    "125m": Size(12, 768, 12),
    "350m": Size(24, 1024, 16),
    "760m": Size(24, 1536, 16),
    "1.3b": Size(24, 2048, 16),
    "2.7b": Size(32, 2560, 32),
    "6.7b": Size(32, 4096, 32),
    "9b": Size(27, 5120, 40),  # 13b's blocks, 27 of them (9.0B): the most DeepSpeed's plan fits on an H100
    "10b": Size(32, 5120, 40),  # 13b's blocks, 32 of them (10.6B): between 6.7b and 13b for the largest search
    "12b": Size(36, 5120, 40),  # 13b's blocks, 36 of them (11.8B): the most DeepSpeed's plan fits on one H200
    "13b": Size(40, 5120, 40),
    "15b": Size(46, 5120, 40),  # 13b's blocks, 46 of them (15.0B): the most Gemini's plan fits on one H200, 8 sequences
    "20b": Size(44, 6144, 64),
}
# The sizes --search-largest walks through, smallest first.
SEARCH_ORDER = [name for name in SIZES if name != "tiny"]


def parameter_count(size: Size, length: int) -> int:
    """Every parameter of tools.benchmark.model.GPT(size, length), counted without building it (or torch)."""
    width = size.width
    block = (3 * width * width + 3 * width) + (width * width + width) + (8 * width * width + 5 * width) + 4 * width
    return VOCABULARY * width + length * width + size.layers * block + 2 * width + VOCABULARY * width
