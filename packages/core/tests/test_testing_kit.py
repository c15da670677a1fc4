"""The test kit that core's pytest plugin gives every package: markers, a free port, a script runner."""

from __future__ import annotations

import socket
import sys

import pytest

from lightning_strategies.testing import ScriptFailed, free_port, run_script


def test_the_plugin_registers_the_gpu_and_tpu_markers(pytestconfig: pytest.Config) -> None:
    declared = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert {"gpu", "tpu"} <= declared


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
