"""Every check of the monorepo as a nox session.

The test matrix is not written here: each package's pyproject.toml declares its runners and
dependency sets under ``[tool.lightning-strategies.tests]``, and this file turns them into
sessions named ``tests-<package>-<dependency set>-<runner>``, tagged with the runner and the
package. GPU and TPU sessions are not default: they run on machines that have one.

    nox -l                    # every session
    nox -t cpu                # what CI runs
    nox -t cpu-extended       # the dependency sets CI leaves out (the floors)
    nox -t lightning-prerelease  # the CPU tier against Lightning's newest pre-release, where there is one
    nox -t deepspeed          # one package, every runner it has here
    nox -s demo               # train by strategy name on CPU
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tomllib
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path

import nox
from packaging.version import Version

ROOT = Path(__file__).parent
PACKAGES = ROOT / "packages"
PYTHON = "3.11"
MARKERS = {"cpu": "not gpu and not tpu", "gpu": "gpu", "tpu": "tpu"}

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = False

# The CPU sessions together install about 16 GB (the xla one alone 7 GB: torch_xla pins a CUDA
# build of torch), more than a CI machine may have free. With LIGHTNING_STRATEGIES_DISCARD_ENVS=1,
# which .ci/run sets, each session deletes its environment when it ends; with "on-failure", only
# when the session fails (.ci/run installs ahead with `--install-only`, and runs the tests later).
DISCARD_ENVS = os.environ.get("LIGHTNING_STRATEGIES_DISCARD_ENVS", "0")

# pip byte-compiles every module it installs, one file after another: about 20 s for torch and Lightning in each
# session and 45 s for colossalai-gemini's dependency set on two cores, most of it for modules no test imports. The
# sessions install with --no-compile instead, and Python writes the bytecode of what a session imports on its first
# import (about 4 s for torch and Lightning). A PYTHONDONTWRITEBYTECODE inherited from the machine would make every
# process compile them again, so the sessions' commands run without it.
PIP_OPTIONS = ("--no-compile",)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def nox_session(**options) -> Callable:
    """``nox.session`` for every session here, discarding its environment afterwards where asked."""

    def register(function: Callable[[nox.Session], None]) -> Callable:
        @functools.wraps(function)
        def run(session: nox.Session) -> None:
            failed = True
            try:
                function(session)
                failed = False
            finally:
                discard = DISCARD_ENVS == "1" or (DISCARD_ENVS == "on-failure" and failed)
                if discard and session.virtualenv.location:
                    shutil.rmtree(session.virtualenv.location, ignore_errors=True)

        return nox.session(**options)(run)

    return register


def install(session: nox.Session, *requirements: str, env: dict[str, str] | None = None) -> None:
    """``pip install`` into the session's environment, without byte-compiling (PIP_OPTIONS says why)."""
    session.install(*PIP_OPTIONS, *requirements, env=env)


def package_settings(folder: Path) -> dict:
    with open(folder / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle).get("tool", {}).get("lightning-strategies", {}).get("tests", {})


def install_system_packages(session: nox.Session, names: list[str]) -> None:
    """Debian packages a package's tests need (libaio-dev for NVMe offload), where missing."""
    missing = [name for name in names if not Path(f"/usr/share/doc/{name}").exists()]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        session.error(f"These tests need the system packages {missing}: sudo apt-get install -y {' '.join(missing)}")
    # Installation steps (run_install): with `nox --install-only`, as .ci/run installs the next session ahead.
    session.run_install("apt-get", "update", "-qq", external=True)
    session.run_install("apt-get", "install", "-y", "-qq", *missing, external=True)


def package_env(settings: dict) -> dict[str, str]:
    """The package's ``env`` setting, for its installs and its tests alike."""
    return {key: str(value) for key, value in settings.get("env", {}).items()}


def install_package(session: nox.Session, folder: Path, dependency_set: list[str], settings: dict) -> None:
    env = package_env(settings)
    install(session, *dependency_set, env=env)
    no_deps = settings.get("install", {}).get("no-deps", [])
    if no_deps:
        install(session, "--no-deps", *no_deps, env=env)
    # Sibling packages the tests read checkpoints of (another strategy's folders): installed from the checkout too.
    siblings = [str(PACKAGES / name) for name in settings.get("install", {}).get("with-packages", [])]
    install(session, str(PACKAGES / "core"), str(folder), *siblings, env=env)


def run_tests(session: nox.Session, folder: Path, settings: dict, runner: str, *extra: str, **options) -> None:
    install(session, "pytest", "pytest-timeout")
    env = package_env(settings)
    # Scripts that make what the runner's tests would otherwise build on first use (DeepSpeed's JIT-built ops),
    # run as part of the installation: .ci/run installs a session while the previous session's tests run.
    for script in settings.get("prepare", {}).get(runner, []):
        session.run_install("python", str(folder / script), env=env)
    session.run(
        "pytest", str(folder / "tests"), "-m", MARKERS[runner], "-p", "no:cacheprovider",
        f"--basetemp={session.create_tmp()}/pytest", "--timeout=900", "-ra", *extra, *session.posargs,
        env=env, **options,
    )  # fmt: skip


def make_test_session(folder: Path, dependency_set_name: str, dependency_set: list[str], runner: str) -> None:
    settings = package_settings(folder)

    def tests(session: nox.Session) -> None:
        install_system_packages(session, settings.get("system-packages", []))
        install_package(session, folder, dependency_set, settings)
        run_tests(session, folder, settings, runner)

    # A package may keep some dependency sets out of CI (ci-dependency-sets): they carry the
    # runner's "-extended" tag instead, so `nox -t cpu-extended` still runs them.
    in_ci = dependency_set_name in settings.get("ci-dependency-sets", [dependency_set_name])
    tests.__doc__ = f"{folder.name} tests on the {runner} runner, dependency set {dependency_set_name!r}"
    nox_session(
        name=f"tests-{folder.name}-{dependency_set_name}-{runner}",
        python=PYTHON,
        tags=[runner if in_ci else f"{runner}-extended", folder.name, "tests"],
        default=runner == "cpu" and in_ci,
    )(tests)


def newest_prerelease(session: nox.Session, distribution: str) -> str | None:
    """The newest version of ``distribution`` on the package index, where that is a pre-release (newer than every
    release); None where it is a release, or where the index cannot be asked."""
    listing = session.run(
        "python", "-m", "pip", "index", "versions", distribution, "--pre", silent=True, success_codes=[0, 1]
    )
    found = re.search(rf"^{re.escape(distribution)} \(([^)]+)\)", str(listing or ""), re.MULTILINE)
    return found.group(1) if found and Version(found.group(1)).is_prerelease else None


def make_prerelease_session(folder: Path, dependency_set: list[str]) -> None:
    """The package's CPU tests on its latest dependency set with Lightning's newest pre-release in place of the
    release: allowed to fail (our packages declare the Lightning range they are tested with), but reported."""
    settings = package_settings(folder)

    def tests(session: nox.Session) -> None:
        lightning = newest_prerelease(session, "lightning")
        if lightning is None:
            session.skip("Lightning has no pre-release newer than its latest release on the package index.")
        install_system_packages(session, settings.get("system-packages", []))
        install_package(session, folder, dependency_set, settings)
        # Over the declared range (pip says so, and installs it): the point is to see what the next release breaks.
        standalone = newest_prerelease(session, "pytorch-lightning")
        install(session, f"lightning=={lightning}", *([f"pytorch-lightning=={standalone}"] if standalone else []))
        report = Path(session.create_tmp()) / "junit.xml"
        # pytest's 1 is "tests failed", which is allowed here; anything else (an error in collection) is not.
        run_tests(session, folder, settings, "cpu", f"--junitxml={report}", success_codes=[0, 1])
        suite = ElementTree.parse(report).getroot().find("testsuite")
        failed = sum(int(suite.get(kind, 0)) for kind in ("failures", "errors")) if suite is not None else 0
        if failed:
            session.warn(f"{failed} {folder.name} tests fail against lightning {lightning} (allowed); see {report}")
        else:
            session.log(f"Every {folder.name} CPU test passes against lightning {lightning}.")

    tests.__doc__ = f"{folder.name} CPU tests against Lightning's newest pre-release (allowed to fail)"
    nox_session(
        name=f"tests-{folder.name}-lightning-prerelease-cpu",
        python=PYTHON,
        tags=["lightning-prerelease", folder.name],
        default=False,
    )(tests)


for package_folder in sorted(PACKAGES.iterdir()):
    if not (package_folder / "pyproject.toml").exists():
        continue
    package_tests = package_settings(package_folder)
    for set_name, requirements in package_tests.get("dependency-sets", {}).items():
        for runner_name in package_tests.get("runners", ["cpu"]):
            make_test_session(package_folder, set_name, requirements, runner_name)
    latest = package_tests.get("dependency-sets", {}).get("latest")
    if latest and "cpu" in package_tests.get("runners", ["cpu"]):
        make_prerelease_session(package_folder, latest)


@nox_session(python=PYTHON, tags=["cpu", "lint"])
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    install(session, "ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox_session(python=PYTHON, tags=["cpu", "types"])
def types(session: nox.Session) -> None:
    """mypy over every package's src, each checked against core and Lightning as installed together.

    The backends (deepspeed, colossalai, torch_xla) stay out: their pins conflict, and with
    ignore_missing_imports their modules are Any, so what is checked is our code against core,
    torch and Lightning.
    """
    packages = sorted(folder for folder in PACKAGES.iterdir() if (folder / "pyproject.toml").exists())
    install(session, "mypy", "torch==2.13.0", "lightning==2.6.6", "pytorch-lightning==2.6.6", str(PACKAGES / "core"))
    install(session, "--no-deps", *(str(folder) for folder in packages if folder.name != "core"))
    session.run("mypy", *(str(folder / "src") for folder in packages))


@nox_session(python=PYTHON, tags=["cpu", "integration"])
def integration(session: nox.Session) -> None:
    """Built wheels installed into fresh environments, as users install them."""
    # hatchling builds the wheels without build isolation; jsonargparse is LightningCLI's.
    install(
        session, "torch==2.13.0", "lightning==2.6.6", "pytorch-lightning==2.6.6", "jsonargparse[signatures]>=4.39",
        "hatchling", "pytest", "pytest-timeout",
    )  # fmt: skip
    session.run("pytest", str(ROOT / "integration_tests"), "-m", "not gpu", "-p", "no:cacheprovider", "-ra",
                f"--basetemp={session.create_tmp()}/pytest", "--timeout=1800", *session.posargs)  # fmt: skip


@nox_session(python=PYTHON, name="benchmark-harness", tags=["cpu", "benchmark"])
def benchmark_harness(session: nox.Session) -> None:
    """The benchmark harness (tools/benchmark) on CPU: tiny GPT runs trained for real, repeats, report."""
    # The harness's Trainer and FSDP2 runs use the fsdp package, on its latest dependency set; its memory-plan
    # test reads the deepspeed package's memory model, which needs no DeepSpeed.
    fsdp = PACKAGES / "fsdp"
    install(session, *package_settings(fsdp)["dependency-sets"]["latest"], str(PACKAGES / "core"), str(fsdp))
    install(session, "--no-deps", str(PACKAGES / "deepspeed"))
    install(session, "matplotlib", "pytest", "pytest-timeout")
    session.run(
        "pytest", str(ROOT / "tools" / "benchmark" / "test_harness.py"), "-p", "no:cacheprovider", "-ra",
        f"--basetemp={session.create_tmp()}/pytest", "--timeout=900", *session.posargs,
        env={"OMP_NUM_THREADS": "1"},  # two training processes on small machines, as in the fsdp package's tests
    )  # fmt: skip


@nox_session(python=PYTHON, tags=["cpu", "docs"])
def docs(session: nox.Session) -> None:
    """The documentation site, with warnings as errors; generated reference pages must be current."""
    install(session, "mkdocs==1.6.1", str(PACKAGES / "core"))
    session.run("python", str(ROOT / "tools" / "generate_reference.py"), "--check")
    session.run("python", str(ROOT / "tools" / "check_docs.py"))  # install lines, claims, benchmark pages
    session.run("mkdocs", "build", "--strict")


@nox_session(python=PYTHON, tags=["demo"], default=False)
def demo(session: nox.Session) -> None:
    """Train a small model by strategy name on CPU (default: fsdp on two processes)."""
    # pip warns on every install as root (a CI container, a fresh cloud machine): the demo's
    # environment is nox's own, so the warning tells the reader nothing.
    quiet_pip = {"PIP_ROOT_USER_ACTION": "ignore"}
    install(session, "torch==2.13.0", "lightning==2.6.6", str(PACKAGES / "core"), str(PACKAGES / "fsdp"), env=quiet_pip)
    session.run("python", str(ROOT / "tools" / "demo.py"), *session.posargs)
