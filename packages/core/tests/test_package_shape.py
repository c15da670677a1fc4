"""Every strategy package under packages/ has one shape: the same module names for the same roles, so whoever
knows one package finds their way in the next, and a new package knows where each concern goes.

Where a package differs, ALLOWED_DIFFERENCES says why. A difference missing from it fails, and so does an
allowance that no longer matches the package, so the table cannot outlive what it explains.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[3]
PACKAGES = sorted(
    folder
    for folder in (REPOSITORY / "packages").iterdir()
    if (folder / "pyproject.toml").is_file() and folder.name != "core"  # core is the host, not a strategy package
)

# Files every package has beside its source, by role.
PACKAGE_FILES = {
    "pyproject.toml": "its own version, dependencies, entry point and test matrix (noxfile.py reads the matrix)",
    "README.md": "what it provides and how to install it",
    "CHANGELOG.md": "one line per user-visible change",
    "tests/conftest.py": "the package's own fixtures (the gpu and tpu markers come from core's pytest plugin)",
}

# Modules every package has, by role.
MODULES = {
    "__init__.py": "the import package, light to import",
    "plugin.py": "what the entry point names: hook implementations with names and metadata, nothing heavy",
    "strategy.py": "the Trainer strategy classes",
    "precision.py": "the precision plugins",
    "version.py": "the version, which hatch reads",
    "py.typed": "PEP 561: type checkers read the package's annotations",
}

# Modules for a role most packages have; a package without one appears in ALLOWED_DIFFERENCES.
ROLE_MODULES = {
    "fabric.py": "the lightning.Fabric strategy classes",
    "memory.py": "the memory model behind the memory_plan_candidates hook (`lightning-strategies plan`)",
    "backend.py": "importing the backend and checking its tested version range",
    "options.py": "the constructor parameters mapped onto the backend's arguments, with no backend import",
    "checkpoint.py": "the strategy's checkpoint format, checked before the backend reads it",
}

# (package folder, role module) -> why it is missing, and where the role lives instead where it exists.
ALLOWED_DIFFERENCES = {
    ("colossalai-gemini", "fabric.py"): "registers its names for the Trainer only: it ships no Fabric strategy",
    ("colossalai-gemini", "checkpoint.py"): (
        "two formats, a module each: checkpoint_state.py (full files: what Gemini leaves out of its state "
        "dicts) and sharded_checkpoint.py (the sharded folder)"
    ),
    ("deepspeed", "options.py"): "config.py: the parameters become a DeepSpeed config, DeepSpeed's own word for it",
    ("fsdp", "backend.py"): "FSDP2 is part of torch: there is no backend beside it to import or range to check",
    ("xla", "backend.py"): "devices.py imports torch_xla with its range, beside the device discovery it serves",
    ("xla", "memory.py"): "no memory model: `lightning-strategies plan` predicts GPU and host memory, not TPU memory",
    ("xla", "options.py"): "its strategies subclass Lightning's XLA strategies and keep their parameters",
    ("xla", "checkpoint.py"): "xla_fsdp_checkpoint.py: only xla_fsdp has a checkpoint format of its own",
}


def source_folder(package: Path) -> Path:
    folders = [folder for folder in (package / "src").iterdir() if folder.is_dir() and folder.name != "__pycache__"]
    assert len(folders) == 1, f"{package.name}/src should hold one import package, found {[f.name for f in folders]}"
    return folders[0]


def package_settings(package: Path) -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as CI runs; the packages support 3.10
    with open(package / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)


def package_id(package: Path) -> str:
    return package.name


def test_there_are_packages_to_check() -> None:
    assert len(PACKAGES) >= 4, f"expected the strategy packages under packages/, found {[p.name for p in PACKAGES]}"


@pytest.mark.parametrize("package", PACKAGES, ids=package_id)
def test_every_package_has_the_files_of_every_role(package: Path) -> None:
    source = source_folder(package)
    missing = [f"{name} ({role})" for name, role in PACKAGE_FILES.items() if not (package / name).is_file()]
    missing += [f"{source.name}/{name} ({role})" for name, role in MODULES.items() if not (source / name).is_file()]
    assert not missing, f"packages/{package.name} lacks: " + "; ".join(missing)


@pytest.mark.parametrize("package", PACKAGES, ids=package_id)
def test_role_modules_are_named_alike_or_the_difference_is_explained(package: Path) -> None:
    source = source_folder(package)
    unexplained = [
        f"{name} ({role})"
        for name, role in ROLE_MODULES.items()
        if not (source / name).is_file() and (package.name, name) not in ALLOWED_DIFFERENCES
    ]
    assert not unexplained, (
        f"packages/{package.name} has no module for: {'; '.join(unexplained)}. Put that concern in a module of "
        "that name, or, where the package has no such role, add the reason to ALLOWED_DIFFERENCES."
    )


@pytest.mark.parametrize(("package_name", "name"), sorted(ALLOWED_DIFFERENCES))
def test_every_allowance_still_matches_a_difference(package_name: str, name: str) -> None:
    package = REPOSITORY / "packages" / package_name
    assert package in PACKAGES, f"ALLOWED_DIFFERENCES names packages/{package_name}, which is gone: remove its rows"
    source = source_folder(package)
    assert not (source / name).is_file(), (
        f"packages/{package_name} now has {name}: remove ({package_name!r}, {name!r}) from ALLOWED_DIFFERENCES"
    )
    # Where the allowance names the modules that hold the role instead, they exist.
    for module in re.findall(r"\b(\w+\.py)\b", ALLOWED_DIFFERENCES[(package_name, name)]):
        assert (source / module).is_file(), f"ALLOWED_DIFFERENCES names {package_name}'s {module}, which is gone"


@pytest.mark.parametrize("package", PACKAGES, ids=package_id)
def test_the_entry_point_names_plugin_py_and_hatch_reads_version_py(package: Path) -> None:
    settings = package_settings(package)
    source = source_folder(package)
    entry_points = settings["project"]["entry-points"]["lightning_strategies"]
    assert list(entry_points.values()) == [f"{source.name}.plugin"], (
        f"packages/{package.name}'s entry point in group lightning_strategies should name {source.name}.plugin, "
        f"the light module of hook implementations; it names {entry_points}"
    )
    assert settings["tool"]["hatch"]["version"]["path"] == f"src/{source.name}/version.py"


@pytest.mark.parametrize("package", PACKAGES, ids=package_id)
def test_tests_take_the_gpu_and_tpu_markers_from_core(package: Path) -> None:
    # Core's pytest plugin (entry point pytest11) declares them; a package declaring them again could drift.
    declaring = [
        str(path.relative_to(REPOSITORY))
        for path in (package / "tests" / "conftest.py", package / "pyproject.toml")
        if re.search(r"addinivalue_line\(\s*[\"']markers|^markers\s*=", path.read_text(), re.MULTILINE)
    ]
    assert not declaring, f"{declaring} declare pytest markers; core's pytest plugin declares gpu and tpu for all"
