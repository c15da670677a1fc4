"""`lightning-strategies doctor`: what this machine can run, and what to install for the rest."""

from __future__ import annotations

import ctypes.util
import importlib.util
import platform
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import Version

from lightning_strategies.registry import StrategyRegistry


@dataclass
class Finding:
    what: str
    ok: bool
    detail: str


def _tool_version(executable: str, flag: str = "--version") -> str | None:
    path = shutil.which(executable)
    if path is None:
        return None
    try:
        output = subprocess.run([path, flag], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return path
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1].strip() if executable == "nvcc" and lines else (lines[0].strip() if lines else path)


def machine_findings() -> list[Finding]:
    findings = [Finding("python", True, f"{platform.python_version()} on {platform.machine()}")]
    try:
        import torch
    except ImportError:
        findings.append(Finding("torch", False, "not installed: pip install torch"))
        return findings
    cuda = torch.cuda.is_available()
    cuda_detail = (
        f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
        if cuda
        else f"no CUDA device (torch built with CUDA {torch.version.cuda})"
        if torch.version.cuda
        else "CPU-only build"
    )
    findings.append(Finding("torch", True, f"{torch.__version__}; {cuda_detail}"))
    for distribution in ("lightning", "pytorch-lightning"):
        version = _version(distribution)
        findings.append(
            Finding(distribution, version is not None, version or f"not installed: pip install {distribution}")
        )
    compiler = _tool_version("c++") or _tool_version("g++")
    findings.append(Finding("C++ compiler (JIT kernels)", compiler is not None, compiler or "apt-get install g++"))
    ninja = importlib.util.find_spec("ninja") is not None or shutil.which("ninja") is not None
    findings.append(Finding("ninja (JIT kernels)", ninja, "found" if ninja else "pip install ninja"))
    nvcc = _tool_version("nvcc")
    findings.append(
        Finding(
            "nvcc (CUDA kernels)",
            nvcc is not None or not cuda,
            nvcc or "not found (needed only for CUDA kernels)",
        )
    )
    libaio = ctypes.util.find_library("aio")
    findings.append(
        Finding("libaio (NVMe offload)", libaio is not None, libaio or "not found: apt-get install libaio-dev")
    )
    return findings


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def backend_findings(registry: StrategyRegistry) -> list[Finding]:
    """Each installed strategy distribution's requirements against what is installed."""
    findings = []
    for distribution in sorted({entry.distribution for entry in registry if entry.distribution}):
        try:
            requirements = metadata.requires(distribution) or []
        except metadata.PackageNotFoundError:  # registered in-process, not installed
            continue
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            installed = _version(requirement.name)
            if installed is None:
                findings.append(
                    Finding(
                        f"{distribution}: {requirement.name}",
                        False,
                        f"not installed: pip install '{requirement}'",
                    )
                )
                continue
            in_range = requirement.specifier.contains(Version(installed), prereleases=True)
            detail = f"{installed} (tested: {requirement.specifier or 'any'})"
            if not in_range:
                detail += f"; install a tested version: pip install '{requirement}'"
            findings.append(Finding(f"{distribution}: {requirement.name}", in_range, detail))
    if registry.plugin_manager is not None:
        for checks in registry.plugin_manager.hook.environment_checks():
            findings.extend(Finding(what, ok, detail) for what, ok, detail in checks or [])
    return findings
