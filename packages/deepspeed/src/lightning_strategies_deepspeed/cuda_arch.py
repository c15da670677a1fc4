"""Making TORCH_CUDA_ARCH_LIST readable by DeepSpeed's op builder.

PyTorch accepts architecture-specific entries such as ``9.0a`` (Hopper's sm_90a) and named
architectures such as ``Hopper``; DeepSpeed 0.16-0.19 parses each entry as ``int.int`` when it
JIT-builds an op (FusedAdam, CPUAdam...) and stops with ``ValueError: invalid literal for int()
with base 10: '0a'``. GPU images for H100/H200 set ``9.0a``. The kernels DeepSpeed builds use no
arch-specific instructions, so building them for the plain architecture (``9.0``) is equivalent.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

VARIABLE = "TORCH_CUDA_ARCH_LIST"

# The architecture names torch.utils.cpp_extension accepts, as the numbers they stand for.
_NAMED_ARCHITECTURES = {
    "kepler+tesla": ["3.7"],
    "kepler": ["3.5+PTX"],
    "maxwell+tegra": ["5.3"],
    "maxwell": ["5.0", "5.2+PTX"],
    "pascal": ["6.0", "6.1+PTX"],
    "volta+tegra": ["7.2"],
    "volta": ["7.0+PTX"],
    "turing": ["7.5+PTX"],
    "ampere+tegra": ["8.7"],
    "ampere": ["8.0", "8.6+PTX"],
    "ada": ["8.9+PTX"],
    "hopper": ["9.0+PTX"],
}
_ENTRY = re.compile(r"^(\d+)\.(\d+)[a-z]*(\+ptx)?$", re.IGNORECASE)


def normalize_arch_list(value: str) -> str:
    """``value`` with every entry in the ``major.minor[+PTX]`` form DeepSpeed parses.

    Suffixes such as ``a`` or ``f`` are dropped, names become numbers, duplicates go, the order
    stays. Entries that are neither are kept as they are (DeepSpeed will name them).
    """
    entries: list[str] = []
    for raw in re.split(r"[;\s]+", value.strip()):
        if not raw:
            continue
        expanded = _NAMED_ARCHITECTURES.get(raw.lower(), [raw])
        for entry in expanded:
            match = _ENTRY.match(entry)
            normal = f"{match[1]}.{match[2]}{'+PTX' if match[3] else ''}" if match else entry
            plain = normal.removesuffix("+PTX")
            if normal.endswith("+PTX") and plain in entries:
                entries[entries.index(plain)] = normal
            elif normal not in entries and f"{plain}+PTX" not in entries:
                entries.append(normal)
    return ";".join(entries)


def normalize_environment(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Rewrite TORCH_CUDA_ARCH_LIST in ``environ`` if DeepSpeed could not parse it; return the new value."""
    value = environ.get(VARIABLE)
    if not value:
        return None
    normal = normalize_arch_list(value)
    if normal == value:
        return None
    environ[VARIABLE] = normal
    log.info(
        "%s=%r rewritten to %r for DeepSpeed's op builder, which cannot parse the original.", VARIABLE, value, normal
    )
    return normal
