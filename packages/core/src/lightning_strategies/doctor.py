"""`lightning-strategies doctor`: what this machine can run, and what to install for the rest.

Core reports what every strategy shares (Python, torch, CUDA devices, host memory, Lightning) and each
strategy distribution's declared requirements; what a backend needs besides (compilers for its kernels,
libaio) its package reports through the ``environment_checks`` hook.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import Version

from lightning_strategies.backends import installed_version
from lightning_strategies.entries import StrategyEntry
from lightning_strategies.hooks import plugins_of
from lightning_strategies.registry import StrategyRegistry


@dataclass
class Finding:
    what: str
    ok: bool
    detail: str


def machine_findings() -> list[Finding]:
    """What every strategy needs: Python, torch and its CUDA devices, the host, Lightning."""
    findings = [Finding("python", True, f"{platform.python_version()} on {platform.machine()}")]
    try:
        import torch
    except ImportError:
        findings.append(Finding("torch", False, "not installed: pip install torch"))
        return findings
    cuda = torch.cuda.is_available()
    cuda_detail = (
        f"CUDA {torch.version.cuda}"
        if cuda
        else f"no CUDA device (torch built with CUDA {torch.version.cuda})"
        if torch.version.cuda
        else "CPU-only build"
    )
    findings.append(Finding("torch", True, f"{torch.__version__}; {cuda_detail}"))
    findings.append(Finding("host", True, _host_detail()))
    for index in range(torch.cuda.device_count() if cuda else 0):
        properties = torch.cuda.get_device_properties(index)
        findings.append(
            Finding(
                f"CUDA device {index}",
                True,
                f"{properties.name}, {properties.total_memory / 2**30:.1f} GiB, "
                f"compute capability {properties.major}.{properties.minor}",
            )
        )
    for distribution in ("lightning", "pytorch-lightning"):
        version = installed_version(distribution)
        findings.append(
            Finding(distribution, version is not None, version or f"not installed: pip install {distribution}")
        )
    return findings


def _host_detail() -> str:
    cores = os.cpu_count() or 0
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not every platform reports it
        return f"{cores} CPU cores"
    return f"{cores} CPU cores, {memory / 2**30:.1f} GiB memory"


def available_accelerators() -> dict[str, str]:
    """The accelerators a strategy could use here, with what was found (Lightning's names)."""
    found = {"cpu": f"{os.cpu_count() or 0} cores"}
    try:
        import torch
    except ImportError:
        return found
    if torch.cuda.is_available():
        found["cuda"] = f"{torch.cuda.device_count()} device(s)"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found["mps"] = "available"
    if importlib.util.find_spec("torch_xla") is not None:
        found["tpu"] = "torch_xla installed"
    return found


def strategy_findings(registry: StrategyRegistry) -> list[Finding]:
    """For each installed strategy distribution, whether its names can run on this machine, from their
    declared accelerators."""
    here = available_accelerators()
    by_provider: dict[str, list[StrategyEntry]] = {}
    for entry in registry:
        by_provider.setdefault(entry.distribution or entry.provider, []).append(entry)
    findings = []
    for provider, entries in sorted(by_provider.items()):
        runnable = [entry.name for entry in entries if not entry.accelerators or set(entry.accelerators) & set(here)]
        blocked = [entry for entry in entries if entry.name not in runnable]
        if runnable:
            findings.append(Finding(f"{provider}: runs here", True, ", ".join(runnable)))
        if blocked:
            needed = sorted({accelerator for entry in blocked for accelerator in entry.accelerators or ()})
            findings.append(
                Finding(
                    f"{provider}: cannot run here",
                    False,
                    f"{', '.join(entry.name for entry in blocked)}: need {' or '.join(needed)}; this machine has "
                    f"{', '.join(f'{name} ({detail})' for name, detail in here.items())}",
                )
            )
    return findings


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
            installed = installed_version(requirement.name)
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
    checks = plugins_of(registry).environment_checks()
    for answer in checks.answers:
        findings.extend(Finding(what, ok, detail) for what, ok, detail in answer)
    for failure in checks.failures:
        findings.append(Finding(f"plugin {failure.plugin!r}", False, f"{failure.reason}; {failure.what_to_do}"))
    return findings
