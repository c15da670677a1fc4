"""Saying, before it happens, that ColossalAI compiles its optimizer kernels on first use.

HybridAdam and CPUAdam JIT-build C++/CUDA extensions the first time they are constructed on a
machine (cpu_adam took about 36 s and fused_optim about 54 s on an H200 host), and a silent
minute and a half looks like a hang. The builds are cached, so later runs only load them.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.utilities.rank_zero import rank_zero_info

BUILD_SECONDS = {"cpu_adam": 36, "fused_optim": 54}


def kernel_cache_folder() -> Path | None:
    """Where ColossalAI keeps JIT-built kernels for this torch and device, if it can say."""
    try:
        from colossalai.kernel.extensions.base_extension import _Extension
    except ImportError:
        return None
    return Path(_Extension.get_jit_extension_folder_path())


def announce_kernel_build() -> bool:
    """Log one line before the optimizer is built; returns True when a build is expected."""
    folder = kernel_cache_folder()
    cached = folder is not None and folder.is_dir() and any(folder.iterdir())
    if cached:
        rank_zero_info(f"ColossalAI: loading cached optimizer kernels from {folder}.")
        return False
    estimate = ", ".join(f"{name} ~{seconds} s" for name, seconds in BUILD_SECONDS.items())
    rank_zero_info(
        f"ColossalAI: building optimizer kernels on first use ({estimate}); they are cached "
        f"under {folder or '~/.cache/colossalai'} and later runs load them in seconds."
    )
    return True
