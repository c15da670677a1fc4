"""Importing the library a strategy drives, with an install line when it is missing or too old, and
checking what building its kernels needs (for a plugin's ``environment_checks``); a package's names that
import only when first used (``lazy_exports``).

The supported range comes from the strategy distribution's own ``Requires-Dist`` metadata, so
pyproject.toml stays the one place a range is written.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
from collections.abc import Callable, Mapping
from importlib import metadata
from types import ModuleType
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

from lightning_strategies.errors import MissingBackendError

__all__ = [
    "installed_version",
    "jit_build_checks",
    "lazy_exports",
    "require_backend",
]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports each name of ``exports`` (name -> module)
    from its module on first use, so that importing the package imports no backend::

        __getattr__ = lazy_exports(__name__, {"AcmeStrategy": "acme_strategy.strategy"})
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def declared_requirement(distribution: str, backend_distribution: str) -> Requirement | None:
    """The requirement ``distribution`` declares on ``backend_distribution``, if installed and declared."""
    try:
        requirements = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return None
    for text in requirements:
        requirement = Requirement(text)
        if requirement.name.lower() == backend_distribution.lower() and not requirement.marker:
            return requirement
    return None


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def require_backend(
    module: str,
    *,
    backend_distribution: str,
    strategy_distribution: str,
    install_hint: str | None = None,
    supported: str | None = None,
) -> ModuleType:
    """Import ``module`` or raise MissingBackendError saying how to install a supported version.

    ``supported`` (a specifier such as ``">=0.5,<0.6"``) is for backends a package cannot declare
    as a requirement, such as one installed with ``--no-deps``; otherwise the declared range is used.
    """
    requirement = (
        Requirement(f"{backend_distribution}{supported}")
        if supported
        else declared_requirement(strategy_distribution, backend_distribution)
    )
    spec = f"{backend_distribution}{requirement.specifier}" if requirement else backend_distribution
    how = install_hint or f"pip install '{spec}'"
    version = installed_version(backend_distribution)
    if version is None:
        raise MissingBackendError(
            f"{strategy_distribution} needs {spec}, which is not installed. Install it with: {how}"
        )
    if requirement and not requirement.specifier.contains(Version(version), prereleases=True):
        raise MissingBackendError(
            f"{strategy_distribution} supports {spec}, but {backend_distribution} {version} is installed. "
            f"Install a supported version with: {how}"
        )
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingBackendError(
            f"{backend_distribution} {version} is installed but `import {module}` failed: {error}. "
            f"Reinstall it with: {how}"
        ) from error


def tool_version(executable: str) -> str | None:
    """What ``executable --version`` says (nvcc's last line, which holds its release; others' first), its path
    where it says nothing readable, or None where it is not on PATH."""
    path = shutil.which(executable)
    if path is None:
        return None
    try:
        output = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return path
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return path
    return lines[-1] if executable == "nvcc" else lines[0]


def jit_build_checks(backend: str) -> list[tuple[str, bool, str]]:
    """``environment_checks`` rows for a backend that JIT-builds C++ and CUDA kernels on first use (torch's
    cpp_extension): a C++ compiler, ninja, and nvcc where a CUDA device is present."""
    compiler = tool_version("c++") or tool_version("g++")
    ninja = importlib.util.find_spec("ninja") is not None or shutil.which("ninja") is not None
    rows = [
        (f"C++ compiler ({backend} JIT kernels)", compiler is not None, compiler or "not found: apt-get install g++"),
        (f"ninja ({backend} JIT kernels)", ninja, "found" if ninja else "not found: pip install ninja"),
    ]
    try:
        import torch
    except ImportError:  # without torch there is no kernel to build; core's doctor says torch is missing
        return rows
    nvcc = tool_version("nvcc")
    cuda = torch.cuda.is_available()
    detail = nvcc or (
        "not found: install the CUDA toolkit that matches torch's CUDA, or put its bin folder on PATH"
        if cuda
        else "not found (needed only on CUDA devices)"
    )
    rows.append((f"nvcc ({backend} CUDA kernels)", nvcc is not None or not cuda, detail))
    return rows
