"""The test kit that core's pytest plugin gives every package: markers, a free port, a script runner, recorded
errors, and the checks each package makes of its plugin against core."""

from __future__ import annotations

import ast
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.strategies import SingleDeviceStrategy

import lightning_strategies.conformance
from lightning_strategies import hookimpl
from lightning_strategies.checkpoints import FILE, CheckpointFormat, identify
from lightning_strategies.plugins import register_plugin
from lightning_strategies.registry import StrategyRegistry
from lightning_strategies.testing import (
    ANOTHER_PACKAGE,
    QUIET_TRAINER,
    ScriptFailed,
    another_packages_checkpoint,
    assert_install_hints_match,
    assert_layout_identified_only_through,
    assert_raises_as_lightning,
    check_lightning_cli_builds,
    described,
    error_of,
    free_port,
    process_state,
    raised_by,
    record_checks,
    run_script,
    side_effects_of_runs,
    state_changes,
)


def test_the_plugin_registers_the_gpu_and_tpu_markers(pytestconfig: pytest.Config) -> None:
    declared = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert {"gpu", "tpu"} <= declared


def test_the_conformance_kit_defines_the_quiet_trainer_the_test_kit_offers() -> None:
    """The suite's runs are library code: they take the quiet Trainer arguments from the conformance package, which
    the pytest kit re-exports for packages' scripts, not the other way round."""
    from lightning_strategies.conformance.trainer_arguments import QUIET_TRAINER as defined

    assert QUIET_TRAINER is defined
    assert QUIET_TRAINER["logger"] is False
    folder = Path(lightning_strategies.conformance.__file__).parent
    taken_from_the_test_kit = [
        f"{path.name}: {alias.name}"
        for path in sorted(folder.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module == "lightning_strategies.testing"
        for alias in node.names
        if alias.name == "QUIET_TRAINER"
    ]
    assert not taken_from_the_test_kit


def test_a_free_port_can_be_listened_on() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", free_port()))
        server.listen()
        assert server.getsockname()[1] > 0


def test_the_fixtures_are_the_kit(free_port: int, run_script) -> None:
    assert 0 < free_port < 65536
    completed = run_script("-c", "print('ran')")
    assert completed.stdout == "ran\n"


def test_a_script_gets_a_fresh_rendezvous_plus_what_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_PORT", "29500")  # what Lightning leaves in os.environ after a run
    monkeypatch.setenv("DROPPED", "1")
    code = "import os; print(os.environ.get('MASTER_PORT'), os.environ.get('EXTRA'), os.environ.get('DROPPED'))"
    completed = run_script("-c", code, env={"EXTRA": "yes"}, unset=["DROPPED"])
    assert completed.stdout.split() == ["None", "yes", "None"]
    assert sys.executable in completed.args[0]


def test_a_failed_script_raises_with_the_tail_of_its_output() -> None:
    code = "import sys; print('x' * 50 + 'stdout end'); sys.stderr.write('y' * 50 + 'stderr end'); sys.exit(3)"
    with pytest.raises(ScriptFailed, match=r"exited with 3") as failure:
        run_script("-c", code, tail=20)
    message = str(failure.value)
    assert "stdout end" in message and "stderr end" in message
    assert "x" * 11 not in message and "y" * 11 not in message


def test_an_unchecked_failure_is_returned() -> None:
    completed = run_script("-c", "import sys; sys.exit(2)", check=False)
    assert completed.returncode == 2


def test_a_recorded_error_is_its_type_and_message() -> None:
    def refuse() -> None:
        raise ValueError("no such folder")

    assert isinstance(raised_by(refuse), ValueError)
    assert raised_by(lambda: None) is None
    assert error_of(refuse) == "ValueError: no such folder"
    assert error_of(lambda: None) == described(None) == "no error"


def _raise(error: Exception) -> Callable[[], None]:
    def call() -> None:
        raise error

    return call


def test_a_refusal_held_against_lightnings_begins_with_its_words_and_is_its_type() -> None:
    class Ours(ValueError, KeyError):
        def __str__(self) -> str:  # a KeyError would quote its message
            return str(self.args[0])

    lightnings = _raise(KeyError("BAD"))  # Lightning's words: "'BAD'", as str() of a KeyError quotes the key
    found = assert_raises_as_lightning(lightnings, _raise(Ours("'BAD'. Choose one of: 'GOOD'.")))
    assert isinstance(found, Ours)
    two_sentences = _raise(ValueError("Unknown name 'x'. It must be one of: a, b."))
    assert_raises_as_lightning(two_sentences, _raise(ValueError("Unknown name 'x'. Close matches: y.")), sentences=1)
    for ours, wrong in [
        (_raise(TypeError("'BAD'")), "not a subclass"),
        (_raise(Ours("BAD is not valid")), "does not begin with Lightning's words"),
        (lambda: None, "ours raised nothing"),
    ]:
        with pytest.raises(AssertionError, match=wrong):
            assert_raises_as_lightning(lightnings, ours)
    with pytest.raises(AssertionError, match="Lightning's call raised nothing"):
        assert_raises_as_lightning(lambda: None, lightnings)


def test_recorded_checks_keep_measured_values_and_errors(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    checks = {"measured": lambda: {"steps": 2}, "ran": lambda: object(), "refused": lambda: 1 / 0}
    record_checks(checks, out)
    assert json.loads(out.read_text()) == {
        "measured": {"value": {"steps": 2}},
        "ran": {"value": None},
        "refused": {"error": "ZeroDivisionError: division by zero"},
    }


class NamesPlugin:
    @hookimpl
    def register_strategies(registry):
        registry.register("fsdp", "somewhere:Strategy", replaces_builtin=True)


class XlaNamesPlugin:
    @hookimpl
    def register_strategies(registry):
        for name in ("xla", "xla_debug", "single_xla", "xla_fsdp"):
            registry.register(name, "somewhere:Strategy", replaces_builtin=True)


def registry_of(plugin: object, distribution: str) -> StrategyRegistry:
    registry = StrategyRegistry()
    register_plugin(registry, plugin, "names", distribution)
    return registry


def test_install_hints_must_name_exactly_what_a_package_registers() -> None:
    assert_install_hints_match("lightning-strategies-xla", registry_of(XlaNamesPlugin, "lightning-strategies-xla"))
    with pytest.raises(AssertionError, match=r"only hinted \[.*'fsdp_no_shard'.*\], only registered \[\].*known\.py"):
        assert_install_hints_match("lightning-strategies-fsdp", registry_of(NamesPlugin, "lightning-strategies-fsdp"))
    with pytest.raises(AssertionError, match="registers no strategy name here"):
        assert_install_hints_match("lightning-strategies-fsdp", StrategyRegistry())


ACME_LAYOUT = CheckpointFormat(
    "acme", "an acme folder", "acme", "acme-convert", matches=lambda path: path.name.endswith(".acme")
)


class LayoutPlugin:
    @hookimpl
    def checkpoint_formats(self) -> list[CheckpointFormat]:
        return [ACME_LAYOUT]


def test_a_layout_is_checked_as_known_only_through_its_plugin(tmp_path: Path) -> None:
    from lightning_strategies import registry as registry_module

    before = registry_module._registry
    folder = tmp_path / "model.acme"
    folder.mkdir()
    assert_layout_identified_only_through(
        LayoutPlugin(), "acme", "acme", ACME_LAYOUT, [folder], not_matching=[tmp_path]
    )
    assert registry_module._registry is before
    with pytest.raises(AssertionError, match="with other's plugin"):
        assert_layout_identified_only_through(LayoutPlugin(), "other", "other", FILE, [folder])
    with pytest.raises(AssertionError, match="are taken for"):
        assert_layout_identified_only_through(
            LayoutPlugin(), "acme", "acme", ACME_LAYOUT, [folder], not_matching=[folder]
        )


def test_another_packages_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    with another_packages_checkpoint(tmp_path) as path:
        assert path == tmp_path / "other.ckpt" and (path / "shard-0").is_file()
        assert identify(path).description == ANOTHER_PACKAGE["description"]
    assert identify(path) is None


def test_state_changes_name_what_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    import torch

    monkeypatch.delenv("LIGHTNING_STRATEGIES_TEST_VARIABLE", raising=False)
    before = process_state()
    monkeypatch.setenv("LIGHTNING_STRATEGIES_TEST_VARIABLE", "left set")
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    logging.getLogger("lightning_strategies.test.created_now").setLevel(logging.ERROR)  # a new logger: no change
    try:
        found = state_changes(before, process_state())
    finally:
        torch.set_default_dtype(previous_dtype)
    assert found == {
        "os.environ['LIGHTNING_STRATEGIES_TEST_VARIABLE']": [None, "left set"],
        "torch.get_default_dtype()": ["torch.float32", "torch.float64"],
    }


def test_lightnings_own_runs_are_the_baseline() -> None:
    assert side_effects_of_runs(["ddp"]) == {"ddp": {}}
    assert side_effects_of_runs(["ddp"], fabric=True) == {"ddp": {}}


class LightningsStandIn(SingleDeviceStrategy):
    def __init__(self, device: str = "cpu", steps: int = 1) -> None:
        super().__init__(device)
        self.steps = steps


class TypedAsLightnings(SingleDeviceStrategy):
    def __init__(self, device: str = "cpu", steps: int = 1, extra: bool = False) -> None:
        super().__init__(device)
        self.steps, self.extra = steps, extra


class AnnotatedAny(SingleDeviceStrategy):
    def __init__(self, device: str = "cpu", steps: Any = 1) -> None:
        super().__init__(device)


def test_lightning_cli_builds_from_a_command_line_and_yaml() -> None:
    built = check_lightning_cli_builds(TypedAsLightnings, {"steps": 3, "extra": True}, LightningsStandIn)
    assert [(strategy.steps, strategy.extra) for strategy in built] == [(3, True), (3, True)]


def test_lightning_cli_check_refuses_any_where_lightning_has_a_type_and_values_it_would_refuse() -> None:
    with pytest.raises(AssertionError, match=r"annotates \['steps'\] as Any"):
        check_lightning_cli_builds(AnnotatedAny, {"steps": 3}, LightningsStandIn)
    with pytest.raises(AssertionError, match=r"refuses .* for test_testing_kit\.LightningsStandIn from cli"):
        check_lightning_cli_builds(TypedAsLightnings, {"steps": "many"}, LightningsStandIn)
    with pytest.raises(AssertionError, match=r"AnnotatedAny does not take \['extra'\]"):
        check_lightning_cli_builds(AnnotatedAny, {}, TypedAsLightnings)
