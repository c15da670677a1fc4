"""Wheels built from this checkout, installed into fresh environments, probed by fresh interpreters.

A fresh environment is a new venv whose own site-packages holds only what a test installs, so
start-up hooks (.pth files) run exactly as for a user. torch and Lightning, which every
scenario needs and none of ours provides, are made visible by one path line pointing at the
test session's site-packages (a path line adds no start-up hooks of its own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(path for path in (ROOT / "packages").iterdir() if (path / "pyproject.toml").exists())


def build_wheel(source: Path, outdir: Path) -> Path:
    before = set(outdir.glob("*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(outdir),
            str(source),
        ],
        check=True,
    )
    (wheel,) = set(outdir.glob("*.whl")) - before
    return wheel


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """One wheel per package folder of this checkout, keyed by folder name."""
    outdir = tmp_path_factory.mktemp("wheels")
    return {folder.name: build_wheel(folder, outdir) for folder in PACKAGES}


class FreshEnvironment:
    def __init__(self, path: Path) -> None:
        venv.EnvBuilder(with_pip=False).create(path)
        self.path = path
        self.python = path / "bin" / "python"
        site = Path(
            subprocess.check_output(
                [self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
            ).strip()
        )
        site.joinpath("test-session-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")

    def install(self, *wheels: Path, no_deps: bool = False) -> None:
        options = ["--no-deps"] if no_deps else []
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.python), "install", "-q", "--no-index",
             "--find-links", str(wheels[0].parent), *options, *map(str, wheels)],
            check=True,
        )  # fmt: skip

    def run(self, code: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [self.python, "-c", textwrap.dedent(code)],
            capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": "", **(env or {})},
        )  # fmt: skip
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    def probe(self, code: str, env: dict[str, str] | None = None) -> object:
        """Run ``code`` (which sets ``result``) and return ``result`` decoded from JSON."""
        code = textwrap.dedent(code) + "\nimport json as _j; print('RESULT ' + _j.dumps(result))"
        output = self.run(code, env).stdout
        line = next(line for line in reversed(output.splitlines()) if line.startswith("RESULT "))
        return json.loads(line.removeprefix("RESULT "))

    def command(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [self.path / "bin" / "lightning-strategies", *arguments], capture_output=True, text=True, timeout=900,
            env={**os.environ, "PYTHONPATH": ""},
        )  # fmt: skip
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result


@pytest.fixture
def fresh_environment(tmp_path) -> Callable[[str], FreshEnvironment]:
    def create(name: str) -> FreshEnvironment:
        return FreshEnvironment(tmp_path / name)

    return create


def plugin_project(
    root: Path,
    distribution: str,
    module: str,
    plugin_source: str,
    extra_modules: dict[str, str] | None = None,
) -> Path:
    """A third-party plugin project, as an author would lay it out, ready to build."""
    package = root / distribution
    source = package / "src" / module
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    (source / "plugin.py").write_text(textwrap.dedent(plugin_source))
    for name, text in (extra_modules or {}).items():
        (source / f"{name}.py").write_text(textwrap.dedent(text))
    (package / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "{distribution}"
        version = "0.1.0"
        dependencies = ["lightning-strategies"]

        [project.entry-points.lightning_strategies]
        {module} = "{module}.plugin"

        [tool.hatch.build.targets.wheel]
        packages = ["src/{module}"]
        """)
    )
    return package
