"""Runs under every DeepSpeed name leave the process as they found it.

Set-up puts DeepSpeed's accelerator, torch's build folder for DeepSpeed's ops and the ranks in ``os.environ``, and
sets DeepSpeed's log level; teardown puts them back (under Fabric, which never tears its strategy down, once the
strategy is gone). The runs start without ``TORCH_EXTENSIONS_DIR``, as users do, so the strategy chooses the
folder itself; it is pointed at the tests' shared one, where the ops are built once.
"""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest
from conftest import EXTENSIONS_DIR, PACKAGE, UNSET

from lightning_strategies.testing import side_effects_of_runs
from lightning_strategies_deepspeed.backend import EXTENSIONS_VARIABLE, default_extensions_folder
from lightning_strategies_deepspeed.plugin import NAMES

NVME = "deepspeed_stage_3_offload_nvme"
WITHOUT_NVME = [name for name in NAMES if name != NVME]


@pytest.fixture
def users_environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A cache folder whose default build folder is the tests' shared one; TORCH_EXTENSIONS_DIR left unset."""
    cache = PACKAGE / ".cache" / "user-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    folder = default_extensions_folder()
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        EXTENSIONS_DIR.mkdir(parents=True, exist_ok=True)
        folder.symlink_to(EXTENSIONS_DIR, target_is_directory=True)
    return {"XDG_CACHE_HOME": str(cache)}


def runs_change(names: list[str], environment: dict[str, str], **arguments: object) -> dict[str, dict]:
    return side_effects_of_runs(names, env=environment, unset=(*UNSET, EXTENSIONS_VARIABLE), **arguments)


def test_trainer_runs_put_back_what_they_set(users_environment: dict[str, str]) -> None:
    assert runs_change(WITHOUT_NVME, users_environment) == {name: {} for name in WITHOUT_NVME}


def test_fabric_runs_put_back_what_they_set_once_the_strategy_is_gone(users_environment: dict[str, str]) -> None:
    assert runs_change(WITHOUT_NVME, users_environment, fabric=True) == {name: {} for name in WITHOUT_NVME}


@pytest.mark.skipif(ctypes.util.find_library("aio") is None, reason="NVMe offload needs libaio (libaio-dev)")
def test_nvme_runs_put_back_what_they_set(users_environment: dict[str, str], tmp_path: Path) -> None:
    options = {NVME: {"nvme_path": str(tmp_path)}}
    assert runs_change([NVME], users_environment, options=options) == {NVME: {}}
