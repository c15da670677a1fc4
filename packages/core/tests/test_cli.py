"""The command line, driven through main() against a throwaway plugin."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from lightning_strategies import hookimpl
from lightning_strategies.cli import main


class DocumentedPlugin:
    @hookimpl
    def register_strategies(registry):
        registry.register(
            "documented",
            "lightning.pytorch.strategies.ddp:DDPStrategy",
            description="DDP, documented",
            init_params={"process_group_backend": "gloo"},
            accelerators=("cpu",),
        )
        registry.register("clashing", "lightning.pytorch.strategies:DDPStrategy")


class ClashingPlugin:
    @hookimpl
    def register_strategies(registry):
        registry.register("clashing", "lightning.pytorch.strategies:DDPStrategy")


@pytest.fixture
def plugins(add_plugin):
    add_plugin(DocumentedPlugin, name="documented", distribution="documented-dist")
    add_plugin(ClashingPlugin, name="clashing", distribution="clashing-dist")


def test_list_shows_ours_builtins_clashes_and_what_to_install(plugins, capsys):
    assert main(["list"]) == 0
    output = capsys.readouterr().out
    assert "documented" in output and "documented-dist 1.0" in output
    assert "ddp_spawn" in output and "Lightning built-in" in output
    assert "CLASH  'clashing' is claimed by documented-dist 1.0 and clashing-dist 1.0" in output
    assert "pip install lightning-strategies-colossalai-gemini" in output


def test_list_as_json(plugins, capsys):
    assert main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {
        "name": "documented",
        "provider": "documented-dist 1.0",
        "supports": "Trainer",
        "description": "DDP, documented",
    } in listing["strategies"]
    assert listing["clashes"] == {"clashing": ["documented-dist 1.0", "clashing-dist 1.0"]}


def test_list_says_which_entry_point_has_each_builtin(plugins, capsys):
    assert main(["list", "--json"]) == 0
    supports = {row["name"]: row["supports"] for row in json.loads(capsys.readouterr().out)["strategies"]}
    assert supports["deepspeed_stage_1_offload"] == "Fabric"
    assert supports["single_device"] == "Trainer"
    assert supports["ddp"] == "Trainer+Fabric"


def test_info_shows_defaults_with_their_meaning_without_importing_the_class(plugins, capsys):
    assert main(["info", "DOCUMENTED"]) == 0
    output = capsys.readouterr().out
    assert "provider:      documented-dist 1.0" in output
    assert "accelerators:  cpu" in output
    assert "process_group_backend='gloo'" in output
    assert "parameters:" in output and "timeout=" in output


class ExplainedPlugin:
    @hookimpl
    def register_strategies(registry):
        registry.register(
            "explained",
            "lightning.pytorch.strategies.ddp:DDPStrategy",
            init_params={"start_method": "spawn"},
            parameters={
                "start_method": "How processes start: popen, spawn, fork or forkserver.",
                "legacy_option": "Kept from the old API; maps to start_method now.",
            },
        )


def test_info_takes_parameter_meanings_from_the_plugins_metadata(add_plugin, capsys):
    add_plugin(ExplainedPlugin)
    assert main(["info", "explained"]) == 0
    output = capsys.readouterr().out
    assert "start_method='spawn'\n        How processes start: popen, spawn, fork or forkserver." in output
    assert "legacy_option\n        Kept from the old API; maps to start_method now." in output


def test_register_refuses_parameter_meanings_that_are_not_text(registry):
    from lightning_strategies.entries import PluginRegistrar

    with pytest.raises(TypeError, match="parameters must map parameter names to their meaning"):
        PluginRegistrar("bad").register("bad", "a.b:C", parameters={"x": 1})


def test_unknown_names_exit_2_with_the_hint(plugins, capsys):
    assert main(["info", "documentd"]) == 2
    assert "Did you mean: 'documented'" in capsys.readouterr().err
    assert main(["check", "colossalai"]) == 2
    assert "pip install lightning-strategies-colossalai-gemini" in capsys.readouterr().err


def test_check_refuses_an_unsupported_accelerator_before_running(plugins, capsys):
    assert main(["check", "documented", "--accelerator", "cuda"]) == 2
    assert "accelerator='cuda' is not supported" in capsys.readouterr().err


class AnyAcceleratorPlugin:
    @hookimpl
    def register_strategies(registry):
        registry.register("any_accelerator", "lightning.pytorch.strategies:DDPStrategy")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--devices", "0"], "--devices 0: the suite needs at least 1 device"),
        (["--accelerator", "quantum"], "--accelerator 'quantum' is not one of"),
        pytest.param(
            ["--accelerator", "cuda"],
            "this machine has no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"),
        ),
    ],
)
def test_check_refuses_impossible_arguments_in_one_line_before_running(add_plugin, capsys, arguments, message):
    add_plugin(AnyAcceleratorPlugin)
    assert main(["check", "any_accelerator", *arguments]) == 2
    captured = capsys.readouterr()
    assert "Running the conformance suite" not in captured.out
    assert message in captured.err and captured.err.count("\n") == 1


def test_doctor_reports_the_machine(plugins, capsys):
    assert main(["doctor"]) == 0
    output = capsys.readouterr().out
    assert "torch" in output and "lightning" in output
    assert "CPU cores" in output and "GiB memory" in output
    # Kernel build tools and libaio are backends' needs: their packages report them, and none is installed here.
    assert "ninja" not in output and "nvcc" not in output and "libaio" not in output


class CudaOnlyPlugin:
    @hookimpl
    def register_strategies(registry):
        registry.register("needs_cuda", "lightning.pytorch.strategies:DDPStrategy", accelerators=("cuda",))

    @hookimpl
    def environment_checks():
        return [("needs_cuda's compiler", False, "apt-get install something")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_doctor_says_which_names_cannot_run_here_and_what_plugins_check(add_plugin, capsys):
    add_plugin(CudaOnlyPlugin, distribution="cuda-only-dist")
    add_plugin(AnyAcceleratorPlugin, name="any", distribution="any-dist")
    assert main(["doctor"]) == 0
    output = capsys.readouterr().out
    assert "NO  cuda-only-dist: cannot run here" in output and "needs_cuda: need cuda; this machine has cpu" in output
    assert "ok  any-dist: runs here" in output
    assert "needs_cuda's compiler" in output and "apt-get install something" in output


def test_a_reader_that_leaves_early_gets_no_traceback():
    # `lightning-strategies list | head -3`: the pipe closes before the listing is written.
    command = [sys.executable, "-m", "lightning_strategies.cli", "list"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


def test_jit_build_checks_report_compiler_ninja_and_nvcc_for_the_backend_that_asks(monkeypatch):
    from lightning_strategies import backends

    found = {"g++": "g++ (GCC) 13.2.0", "nvcc": None}
    monkeypatch.setattr(backends, "tool_version", lambda executable: found.get(executable))
    monkeypatch.setattr(backends.shutil, "which", lambda executable: None)
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    rows = {what: (ok, detail) for what, ok, detail in backends.jit_build_checks("acme")}
    assert rows["C++ compiler (acme JIT kernels)"] == (True, "g++ (GCC) 13.2.0")
    assert rows["ninja (acme JIT kernels)"] == (False, "not found: pip install ninja")
    ok, detail = rows["nvcc (acme CUDA kernels)"]
    assert not ok and "install the CUDA toolkit" in detail
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dict((what, ok) for what, ok, _ in backends.jit_build_checks("acme"))["nvcc (acme CUDA kernels)"]
