"""DeepSpeed's JIT op build on CPU is announced before it starts and kept per environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lightning_strategies_deepspeed.backend import SHARED_MEMORY_OP, default_extensions_folder

ANNOUNCEMENT = f"compiles its shared-memory communication op ({SHARED_MEMORY_OP})"
# Import deepspeed for the CPU as the strategies do, then report the build folder torch will use.
PROGRAM = (
    "import os\n"
    "from lightning_strategies_deepspeed.backend import import_deepspeed\n"
    "import_deepspeed('cpu')\n"
    "print(os.environ['TORCH_EXTENSIONS_DIR'])\n"
)


def start_deepspeed(cache: Path, **variables: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("TORCH_EXTENSIONS_DIR", "LOCAL_RANK")}
    environment.pop("DS_ACCELERATOR", None)
    environment.update(XDG_CACHE_HOME=str(cache), **variables)
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result


def test_the_first_start_in_an_environment_says_what_is_built_and_where_before_it_starts(tmp_path: Path) -> None:
    result = start_deepspeed(tmp_path)
    folder = result.stdout.strip().splitlines()[-1]
    assert folder.startswith(str(tmp_path / "lightning-strategies" / "torch_extensions"))
    assert Path(sys.prefix).name in folder and "torch" in folder and "deepspeed" in folder
    assert ANNOUNCEMENT in result.stderr and f"kept in {folder}" in result.stderr


def test_an_environment_whose_op_is_built_starts_without_a_word(tmp_path: Path) -> None:
    first = start_deepspeed(tmp_path)
    built = Path(first.stdout.strip().splitlines()[-1]) / SHARED_MEMORY_OP / f"{SHARED_MEMORY_OP}.so"
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")  # where torch's build leaves the op; torch, not this test, decides if it is current
    assert ANNOUNCEMENT not in start_deepspeed(tmp_path).stderr


def test_a_folder_the_user_chose_is_used_and_named(tmp_path: Path) -> None:
    chosen = tmp_path / "mine"
    result = start_deepspeed(tmp_path, TORCH_EXTENSIONS_DIR=str(chosen))
    assert result.stdout.strip().splitlines()[-1] == str(chosen)
    assert f"kept in {chosen}" in result.stderr


def test_each_environment_has_its_own_build_folder() -> None:
    # torch's default folder is shared by every environment of a Python version: switching
    # between two of them rebuilt the op for the other's torch each time.
    assert default_extensions_folder("/opt/venv-a") != default_extensions_folder("/opt/venv-b")
    assert default_extensions_folder(sys.prefix) == default_extensions_folder(sys.prefix)
