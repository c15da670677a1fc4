"""tools/new-plugin: a generated plugin package, built and installed like any other, passes its own
tests and `lightning-strategies check` as generated (the promise of the plugin template)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, build_wheel

NEW_PLUGIN = ROOT / "tools" / "new-plugin"
NAME = "acme_sync"  # two words: exercises the name -> distribution, module and class mapping


def new_plugin(*arguments: str, python: Path | str = sys.executable) -> subprocess.CompletedProcess:
    """Run the tool; the test session's Python has no core installed, so it reads the checkout's names."""
    return subprocess.run([python, NEW_PLUGIN, *arguments], capture_output=True, text=True, timeout=60)


def test_generated_plugin_passes_its_own_tests_and_the_check(wheels, fresh_environment, tmp_path, monkeypatch):
    # One thread per process: the suite trains two processes at once on small CI machines.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert os.access(NEW_PLUGIN, os.X_OK)
    env = fresh_environment("template")
    env.install(wheels["core"])
    package = tmp_path / "acme-sync-strategy"
    generated = new_plugin(NAME, str(package), python=env.python)  # reads the installed core's names
    assert generated.returncode == 0, generated.stderr
    files = [path for path in package.rglob("*") if path.is_file()]
    leftovers = [path for path in files if "{{" in str(path.relative_to(package)) or "{{" in path.read_text()]
    assert not leftovers, f"placeholders left in {leftovers}"

    outdir = tmp_path / "plugin-wheel"
    outdir.mkdir()
    plugin_wheel = build_wheel(package, outdir)
    assert plugin_wheel.name.startswith("acme_sync_strategy-0.1.0-")

    env.install(plugin_wheel)  # its dependencies resolve to core and to the test session's Lightning

    info = env.command("info", NAME).stdout
    assert "acme_sync_strategy.strategy:AcmeSyncStrategy" in info and "acme-sync-strategy 0.1.0" in info

    # The generated suite runs against the installed wheel, as a user's CI would run it.
    tests = env.run(
        f"""
        import sys, pytest
        sys.exit(pytest.main([{str(package / "tests")!r}, "-q", "-p", "no:cacheprovider"]))
        """,
        check=False,
    )
    output = tests.stdout + tests.stderr
    assert tests.returncode == 0, output
    summary = output.strip().splitlines()[-1]
    assert re.search(r"\b6 passed\b", summary) and not re.search(r"skipped|xfail|deselected", summary), output

    check = env.command("check", NAME, "--accelerator", "cpu", "--devices", "2", check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "RESULT: passed" in check.stdout
    assert "resume equality [rank 1]" in check.stdout


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("Acme", "not a usable strategy name"),
        ("acme-sync", "not a usable strategy name"),
        ("class", "not a usable strategy name"),
        ("ddp_spawn", "Lightning's built-in strategy names"),
        ("fsdp_hybrid_shard", "lightning-strategies-fsdp"),
    ],
)
def test_unusable_names_are_refused(tmp_path, name, reason):
    result = new_plugin(name, str(tmp_path / "package"))
    assert result.returncode == 2
    assert reason in result.stderr
    assert not (tmp_path / "package").exists()


def test_an_existing_folder_is_left_alone(tmp_path):
    (tmp_path / "package").mkdir()
    (tmp_path / "package" / "notes.txt").write_text("mine")
    result = new_plugin("acme", str(tmp_path / "package"))
    assert result.returncode == 2 and "not empty" in result.stderr
    assert [path.name for path in (tmp_path / "package").iterdir()] == ["notes.txt"]
