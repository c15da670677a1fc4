"""A plugin that raises in any hook is named with its error and skipped for that call; every other plugin's answer
is used. `list`, `doctor`, `plan`, activation and checkpoint identification go on, with a plugin that raises in
every hook registered beside one that answers every hook."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
from conftest import write_distribution

import lightning_strategies
from lightning_strategies import activate, hookimpl, hookspecs
from lightning_strategies.checkpoints import foreign_checkpoint_error, identify
from lightning_strategies.cli import main
from lightning_strategies.hooks import LoadedPlugins, plugins_of
from lightning_strategies.planning import plan

# Answers every hook; what it saw of Lightning's imports is kept in SAW.
SOUND = """
    from pathlib import Path

    from lightning_strategies import hookimpl

    SAW = []

    @hookimpl
    def register_strategies(registry):
        registry.register("sound_ddp", "lightning.pytorch.strategies:DDPStrategy", accelerators=("cpu",))

    @hookimpl
    def environment_checks():
        return [("sound's tool", True, "found")]

    @hookimpl
    def checkpoint_formats():
        from lightning_strategies.checkpoints import CheckpointFormat

        def is_sound_folder(path):
            return (Path(path) / "sound.index").is_file()

        return [CheckpointFormat("sound", "a sound folder", "sound_ddp", "sound-convert {path}", is_sound_folder)]

    @hookimpl
    def lightning_module_imported(module_name):
        SAW.append(module_name)

    @hookimpl
    def memory_plan_candidates(workload, machine):
        from lightning_strategies.planning import candidate

        return [candidate("sound_ddp", {}, 16 * workload.parameters / max(1, machine.gpus), 0, machine)]
"""

# Raises in every hook, as a plugin with a bug would.
RAISING = """
    from lightning_strategies import hookimpl

    @hookimpl
    def register_strategies(registry):
        raise RuntimeError("bug in register_strategies")

    @hookimpl
    def environment_checks():
        raise RuntimeError("bug in environment_checks")

    @hookimpl
    def checkpoint_formats():
        raise RuntimeError("bug in checkpoint_formats")

    @hookimpl
    def lightning_module_imported(module_name, module):
        raise RuntimeError("bug in lightning_module_imported")

    @hookimpl
    def memory_plan_candidates(workload, machine):
        raise RuntimeError("bug in memory_plan_candidates")
"""

A_MACHINE_IT_FITS = ["--gpus", "1", "--gpu-memory", "80", "--host-memory", "100"]


def plugin_module(name: str, source: str) -> ModuleType:
    module = ModuleType(name)
    exec(textwrap.dedent(source), module.__dict__)
    return module


@pytest.fixture
def sound(add_plugin) -> ModuleType:
    """The sound plugin, and the raising one registered after it: pluggy's order calls the plugin registered last
    first, so in every hook the sound plugin answers after the raising one failed."""
    sound = plugin_module("sound_plugin", SOUND)
    add_plugin(sound, name="sound", distribution="sound-dist")
    add_plugin(plugin_module("raising_plugin", RAISING), name="raising", distribution="raising-dist")
    return sound


def sound_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "run.ckpt"
    folder.mkdir()
    (folder / "sound.index").write_text("")
    return folder


def test_list_names_the_plugin_and_lists_the_others(sound, capsys):
    assert main(["list"]) == 0
    output = capsys.readouterr().out
    assert "sound_ddp" in output and "sound-dist 1.0" in output
    assert "SKIPPED plugin 'raising' (raising-dist): register_strategies failed: RuntimeError(" in output


def test_doctor_names_the_plugin_and_shows_the_others_checks(sound, capsys):
    assert main(["doctor"]) == 0
    output = capsys.readouterr().out
    assert "sound's tool" in output and "found" in output
    assert "NO  plugin 'raising'" in output
    assert "environment_checks failed: RuntimeError('bug in environment_checks')" in output
    assert "LIGHTNING_STRATEGIES_DISABLE=raising turns the plugin off" in output


def test_plan_names_the_plugin_and_ranks_the_others(sound, capsys):
    assert main(["plan", "--params", "1B", *A_MACHINE_IT_FITS]) == 0
    output = capsys.readouterr().out
    assert any(line.startswith("yes") and "sound_ddp" in line for line in output.splitlines())
    assert "SKIPPED plugin 'raising' (raising-dist): memory_plan_candidates failed: RuntimeError(" in output


def test_activation_goes_on_with_the_other_plugins(lightning_registries, sound, caplog):
    # lightning_registries comes first: Lightning is imported before the plugins are registered, so their hooks are
    # called by activate(), within the test.
    import lightning.pytorch as pl

    activate()
    assert "lightning.pytorch.strategies" in sound.SAW
    trainer = pl.Trainer(strategy="sound_ddp", accelerator="cpu", devices=1, logger=False)
    assert type(trainer.strategy) is pl.strategies.DDPStrategy
    assert "plugin 'raising' (raising-dist): lightning_module_imported failed" in caplog.text


def test_checkpoints_are_identified_by_the_other_plugins(sound, tmp_path, caplog):
    folder = sound_folder(tmp_path)
    assert identify(folder).key == "sound"
    assert "sound-convert" in str(foreign_checkpoint_error(folder, "FSDP2Strategy", "a DCP folder"))
    assert "plugin 'raising' (raising-dist): checkpoint_formats failed" in caplog.text


def test_a_failure_is_logged_once_however_often_the_hook_is_asked(sound, caplog):
    # Nothing fits, so the planner asks again for smaller batches and larger machines.
    result = plan("20B", micro_batch=1, gpus=1, gpu_memory_gib=80, host_memory_gib=100)
    assert result.suggestions
    assert len(result.problems) == 1
    logged = [record for record in caplog.records if "memory_plan_candidates failed" in record.getMessage()]
    assert len(logged) == 1


class WrongAnswers:
    @hookimpl
    def environment_checks(self):
        return ["not a (what, ok, detail) tuple"]

    @hookimpl
    def checkpoint_formats(self):
        return [object()]

    @hookimpl
    def memory_plan_candidates(self):
        return ["sound_ddp"]


def test_an_answer_of_the_wrong_type_is_a_failure_too(sound, add_plugin, registry, tmp_path, capsys):
    add_plugin(WrongAnswers(), name="wrong", distribution="wrong-dist")
    plugins = plugins_of(registry)
    for call in (plugins.environment_checks, plugins.checkpoint_formats):
        outcome = call()
        assert len(outcome.answers) == 1  # the sound plugin's
        assert {failure.plugin for failure in outcome.failures} == {"raising", "wrong"}
    assert "answered 'not a (what, ok, detail) tuple'" in str(plugins.environment_checks().failures[0].error)
    assert identify(sound_folder(tmp_path)).key == "sound"
    assert main(["doctor"]) == 0
    assert "NO  plugin 'wrong'" in capsys.readouterr().out
    assert main(["plan", "--params", "1B", *A_MACHINE_IT_FITS]) == 0
    assert "plugin 'wrong' (wrong-dist): memory_plan_candidates failed: TypeError(" in capsys.readouterr().out


def test_a_wrapper_hook_makes_the_plugin_invalid(registry, add_plugin):
    class Wrapping:
        @hookimpl(wrapper=True)
        def environment_checks(self):
            return (yield)

    add_plugin(Wrapping(), name="wrapping")
    (problem,) = registry.problems
    assert "invalid plugin: its environment_checks hook is a wrapper" in problem.reason
    assert plugins_of(registry).environment_checks().answers == []


def test_every_hook_has_one_method_with_its_specs_arguments_and_answer():
    specs = [spec for spec in vars(hookspecs).values() if hasattr(spec, f"{hookspecs.PROJECT_NAME}_spec")]
    assert len(specs) == 5
    for spec in specs:
        method = inspect.signature(getattr(LoadedPlugins, spec.__name__))
        arguments = [name for name in method.parameters if name not in ("self", "plugin")]
        assert arguments == list(inspect.signature(spec).parameters), spec.__name__
        assert method.return_annotation == f"HookAnswers[{inspect.signature(spec).return_annotation}]"


def test_core_calls_hooks_only_through_the_hooks_module():
    source = Path(lightning_strategies.__file__).parent
    for path in source.rglob("*.py"):
        if path.name != "hooks.py":
            text = path.read_text()
            assert not [pattern for pattern in (".hook.", "get_hookimpls", "PluginManager(") if pattern in text], path


@pytest.fixture
def installed(tmp_path, on_path) -> Path:
    folder = tmp_path / "site"
    # Entry points load in name order and pluggy asks the plugin loaded last first: "raising" before "answering".
    write_distribution(folder, "sound-dist", {"sound_plugin": SOUND}, {"answering": "sound_plugin"})
    write_distribution(folder, "raising-dist", {"raising_plugin": RAISING}, {"raising": "raising_plugin"})
    on_path(folder)
    return folder


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["list"], "register_strategies failed"),
        (["doctor"], "environment_checks failed"),
        (["plan", "--params", "1B", *A_MACHINE_IT_FITS], "memory_plan_candidates failed"),
    ],
)
def test_installed_the_commands_end_without_a_traceback(installed, command, named):
    result = subprocess.run(
        [sys.executable, "-m", "lightning_strategies.cli", *command], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "plugin 'raising'" in result.stdout and named in result.stdout
    assert "sound" in result.stdout


def test_installed_a_fresh_interpreter_activates_and_identifies(installed, tmp_path):
    folder = sound_folder(tmp_path)
    code = (
        "import lightning.pytorch as pl, sound_plugin;"
        "from lightning_strategies.checkpoints import identify;"
        "t = pl.Trainer(strategy='sound_ddp', accelerator='cpu', devices=1, logger=False);"
        f"print(type(t.strategy).__name__, 'lightning.pytorch.strategies' in sound_plugin.SAW, "
        f"identify({str(folder)!r}).key)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["DDPStrategy", "True", "sound"]
    assert "lightning_module_imported failed" in result.stderr and "checkpoint_formats failed" in result.stderr
