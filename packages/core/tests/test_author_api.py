"""Plugin authors import only the declared face of core: ``lightning_strategies.__all__`` and the ``__all__``
of each module in ``PUBLIC_MODULES``. Our own packages and the plugin template are held to it, so that
core can change everything else without breaking a plugin; docs/plugin-authoring.md lists the same face."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import lightning_strategies

REPOSITORY = Path(__file__).resolve().parents[3]
CORE = "lightning_strategies"
# Every package's own code and the template a third party starts from (placeholders such as {{module}}
# are made into names before parsing).
PACKAGE_SOURCES = sorted(
    folder for folder in (REPOSITORY / "packages").glob("*/src/*") if folder.is_dir() and folder.name != CORE
)
AUTHOR_SOURCES = [
    *PACKAGE_SOURCES,
    REPOSITORY / "tools" / "plugin-template" / "src",
    REPOSITORY / "tools" / "plugin-template" / "tests",
]
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def declared_face() -> dict[str, set[str]]:
    """Each public module and the names it declares; a public submodule is also a name of its parent."""
    face = {CORE: set(lightning_strategies.__all__)}
    for module in lightning_strategies.PUBLIC_MODULES:
        face[module] = set(importlib.import_module(module).__all__)
    for module in lightning_strategies.PUBLIC_MODULES:
        parent, _, child = module.rpartition(".")
        face[parent].add(child)
    return face


def core_imports_outside(face: dict[str, set[str]], source: str, filename: str) -> Iterator[str]:
    """Each import of core in ``source`` that the face does not declare, as ``file:line: what``."""
    for node in ast.walk(ast.parse(PLACEHOLDER.sub(r"\1", source), filename)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_core(node.module or ""):
            module = node.module or ""
            if module not in face:
                yield f"{filename}:{node.lineno}: from {module} import ... (an internal module)"
                continue
            for alias in node.names:
                if alias.name not in face[module]:
                    yield f"{filename}:{node.lineno}: from {module} import {alias.name} (not in its __all__)"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_core(alias.name) and alias.name not in face:
                    yield f"{filename}:{node.lineno}: import {alias.name} (an internal module)"


def _is_core(module: str) -> bool:
    return module == CORE or module.startswith(CORE + ".")


def test_every_declared_name_exists() -> None:
    for module, names in declared_face().items():
        loaded = importlib.import_module(module)
        missing = sorted(name for name in names if not hasattr(loaded, name))
        assert not missing, f"{module} declares {missing} in __all__ but defines no such names"


def test_the_check_finds_imports_outside_the_face() -> None:
    source = (
        "from lightning_strategies import hookimpl, get_registry\n"
        "from lightning_strategies.checkpoints import staged_save\n"
        "from lightning_strategies.registry import StrategyRegistry\n"
        "from lightning_strategies.checkpoints import _remove_tree\n"
        "import lightning_strategies.known\n"
        "from lightning_strategies_other import anything\n"
    )
    found = list(core_imports_outside(declared_face(), source, "plugin.py"))
    assert found == [
        "plugin.py:3: from lightning_strategies.registry import ... (an internal module)",
        "plugin.py:4: from lightning_strategies.checkpoints import _remove_tree (not in its __all__)",
        "plugin.py:5: import lightning_strategies.known (an internal module)",
    ]


@pytest.mark.parametrize("folder", AUTHOR_SOURCES, ids=lambda folder: str(folder.relative_to(REPOSITORY)))
def test_packages_and_the_template_import_only_the_declared_face(folder: Path) -> None:
    face = declared_face()
    files = sorted(folder.rglob("*.py"))
    assert files, f"no Python files under {folder}"
    outside = [
        problem
        for path in files
        for problem in core_imports_outside(face, path.read_text(), str(path.relative_to(REPOSITORY)))
    ]
    assert not outside, (
        "Imports of core outside its declared author API (lightning_strategies.__all__ and PUBLIC_MODULES):\n"
        + "\n".join(outside)
        + "\nImport the name from its public module, or, if authors need it, declare it there and in "
        "docs/plugin-authoring.md."
    )


def test_the_authoring_guide_lists_the_face() -> None:
    guide = (REPOSITORY / "docs" / "plugin-authoring.md").read_text()
    assert "## What a plugin may import" in guide
    section = guide.split("## What a plugin may import", 1)[1].split("\n## ", 1)[0]
    undocumented = [module for module in (CORE, *lightning_strategies.PUBLIC_MODULES) if f"`{module}`" not in section]
    assert not undocumented, f"docs/plugin-authoring.md's 'What a plugin may import' does not name {undocumented}"


@pytest.mark.parametrize(
    "folder", [*PACKAGE_SOURCES, REPOSITORY / "packages" / "core" / "src" / CORE], ids=lambda f: f.name
)
def test_every_package_declares_its_types(folder: Path) -> None:
    # PEP 561: without py.typed, mypy treats an installed package as untyped and checks nothing against it.
    assert (folder / "py.typed").is_file(), f"add an empty {folder.relative_to(REPOSITORY)}/py.typed"
