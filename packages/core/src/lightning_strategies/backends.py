"""Importing the library a strategy drives, with an install line when it is missing or too old.

The supported range comes from the strategy distribution's own ``Requires-Dist`` metadata, so
pyproject.toml stays the one place a range is written.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

from packaging.requirements import Requirement
from packaging.version import Version

from lightning_strategies.errors import MissingBackendError

__all__ = [
    "declared_requirement",
    "installed_version",
    "require_backend",
]


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
