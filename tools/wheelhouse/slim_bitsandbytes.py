"""Drops the bitsandbytes native libraries the GPU machine cannot load, so the wheel fits a call.

The bitsandbytes wheel carries one library per CUDA, ROCm and XPU release (about 41 MiB); the GPU
machine's torch is built for CUDA 13, so bitsandbytes loads libbitsandbytes_cuda13x there and the
CPU library elsewhere. Keeping only those leaves a few MiB of the 64 MiB that one call may carry.
"""

import re
import sys
import zipfile
from pathlib import Path

NATIVE_LIBRARY = re.compile(r"^bitsandbytes/libbitsandbytes_(\w+)\.so$")
KEPT = re.compile(r"^(cpu|cuda13\d)$")


def dropped(name: str) -> bool:
    match = NATIVE_LIBRARY.match(name)
    return match is not None and not KEPT.match(match.group(1))


def slim(wheel: Path) -> None:
    slimmed = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(slimmed, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            if dropped(item.filename):
                continue
            data = source.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                # pip writes the installed RECORD from this one: it must not name removed files.
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not dropped(line.split(",")[0])).encode()
            target.writestr(item, data)
    slimmed.replace(wheel)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        slim(Path(path))
