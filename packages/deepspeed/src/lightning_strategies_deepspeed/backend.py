"""Importing DeepSpeed once the device is known, so it picks the accelerator Lightning uses.

``import deepspeed`` fixes DeepSpeed's accelerator for the life of the process (several of its
modules read it at import time), auto-detecting CUDA whenever a GPU is visible. A run on
``accelerator="cpu"`` therefore has to choose DeepSpeed's CPU accelerator before that import,
which is why the strategies import deepspeed only through ``import_deepspeed``.

On CPU, DeepSpeed's communication layer compiles a shared-memory op the first time it starts,
whatever the optimizer: 40 to 95 s of silence on two cores. ``import_deepspeed`` says so before
it happens, and keeps torch's build folder per environment, so that switching between
environments (another torch or DeepSpeed) does not rebuild it each time.

What this module puts in ``os.environ`` (the accelerator, the build folder, the ranks) and DeepSpeed's
log level belong to a run: the strategies begin one at set-up (``begin_run``) and undo it at teardown.
DeepSpeed's accelerator itself stays as chosen: the run's partitioned parameters keep using it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

from lightning_strategies.backends import require_backend
from lightning_strategies.environment_changes import EnvironmentChanges
from lightning_strategies_deepspeed.cuda_arch import normalize_environment

log = logging.getLogger(__name__)

ACCELERATOR_VARIABLE = "DS_ACCELERATOR"
EXTENSIONS_VARIABLE = "TORCH_EXTENSIONS_DIR"
SHARED_MEMORY_OP = "deepspeed_shm_comm"  # the op DeepSpeed's CPU accelerator builds for its collectives
# Lightning's device type -> DeepSpeed's accelerator name.
_DEEPSPEED_ACCELERATORS = {"cpu": "cpu", "cuda": "cuda"}


class AcceleratorError(RuntimeError, ValueError):
    """An accelerator DeepSpeed does not run on: a RuntimeError, as Lightning's DeepSpeed strategies raise there, and a
    ValueError, as ours raised before."""


def check_accelerator(device_type: str, accelerator: Any) -> None:
    """Refuse, in Lightning's words, a device other than CUDA or CPU before a run begins."""
    if device_type not in _DEEPSPEED_ACCELERATORS:
        raise AcceleratorError(
            f"The DeepSpeed strategy is only supported on CUDA GPUs but `{type(accelerator).__name__}` is used. "
            "lightning-strategies runs it on CPU as well: use accelerator='cuda' or accelerator='cpu'."
        )


class RunChanges:
    """What this module changed in the process for one run: variables in ``os.environ``, DeepSpeed's log level."""

    def __init__(self) -> None:
        self.environment = EnvironmentChanges()
        self.logger_levels: dict[logging.Logger, int] = {}

    def undo(self) -> None:
        self.environment.restore()
        for logger, level in self.logger_levels.items():
            logger.setLevel(level)
        self.logger_levels.clear()


_run = RunChanges()


def begin_run() -> RunChanges:
    """Record this module's changes as a new run's, undoing first what came before: an earlier run's changes
    (Fabric never tears its strategy down), or those of a model built before set-up (``trainer.init_module()``
    under ZeRO-3 imports deepspeed)."""
    global _run
    _run.undo()
    _run = RunChanges()
    return _run


def import_deepspeed(device_type: str | None = None, logging_level: int | None = None) -> ModuleType:
    """Import deepspeed with its accelerator matching ``device_type`` ("cpu" or "cuda")."""
    wanted = _DEEPSPEED_ACCELERATORS.get(device_type or "")
    if device_type is not None and wanted is None:
        raise ValueError(
            f"DeepSpeed strategies run on CUDA GPUs or on CPU, not on {device_type!r}. "
            "Use Trainer(accelerator='cuda') or Trainer(accelerator='cpu')."
        )
    if wanted == "cuda":
        with _run.environment.recording():
            normalize_environment()
    if wanted is not None and "deepspeed" not in sys.modules:
        # Child processes (Lightning's launcher, DeepSpeed's op builds) inherit the choice.
        _run.environment.set(ACCELERATOR_VARIABLE, wanted)
    extensions = use_extensions_folder()
    if wanted == "cpu":
        announce_shared_memory_op_build(extensions)
    deepspeed = require_backend(
        "deepspeed", backend_distribution="deepspeed", strategy_distribution="lightning-strategies-deepspeed"
    )
    if wanted is not None:
        _ensure_accelerator(wanted)
    if logging_level is not None:
        logger = deepspeed.utils.logging.logger
        _run.logger_levels.setdefault(logger, logger.level)
        logger.setLevel(logging_level)
    return deepspeed


def _ensure_accelerator(wanted: str) -> None:
    from deepspeed.accelerator import get_accelerator, set_accelerator

    current = get_accelerator()
    if current.device_name() == wanted:
        return
    if wanted == "cpu":
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        replacement = CPU_Accelerator()
    else:
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

        replacement = CUDA_Accelerator()
    warnings.warn(
        f"deepspeed was imported before the strategy started and chose its {current.device_name()!r} accelerator; "
        f"switching it to {wanted!r}. If this fails, set {ACCELERATOR_VARIABLE}={wanted} before importing deepspeed.",
        RuntimeWarning,
        stacklevel=3,
    )
    set_accelerator(replacement)


def default_extensions_folder(prefix: str = sys.prefix) -> Path:
    """A build folder for this environment alone: torch's default one is shared by every environment
    of a Python version, so that each switch between them rebuilds the op for the other's torch."""
    import torch

    try:
        deepspeed_version = version("deepspeed")
    except PackageNotFoundError:
        deepspeed_version = "none"
    environment = hashlib.sha256(os.path.realpath(prefix).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (
        cache / "lightning-strategies" / "torch_extensions"
        / f"{Path(prefix).name}-{environment}-torch{torch.__version__}-deepspeed{deepspeed_version}"
    )  # fmt: skip


def use_extensions_folder() -> Path:
    """The folder torch builds DeepSpeed's ops in: the user's TORCH_EXTENSIONS_DIR, else this environment's."""
    chosen = os.environ.get(EXTENSIONS_VARIABLE)
    if chosen:
        return Path(chosen)
    folder = default_extensions_folder()
    _run.environment.set(EXTENSIONS_VARIABLE, str(folder))  # read by torch's build, here and in child processes
    return folder


def announce_shared_memory_op_build(extensions: Path) -> bool:
    """Say, once per host, what is about to be compiled and where it is kept: True if it was said."""
    if int(os.environ.get("LOCAL_RANK", "0")) != 0 or any((extensions / SHARED_MEMORY_OP).glob("*.so")):
        return False
    print(
        f"lightning-strategies: DeepSpeed on CPU compiles its shared-memory communication op ({SHARED_MEMORY_OP}) "
        f"the first time it starts in an environment, whatever the optimizer; this takes about a minute. It is kept "
        f"in {extensions} and reused from then on ({EXTENSIONS_VARIABLE} chooses another folder).",
        file=sys.stderr,
        flush=True,
    )
    return True


def export_ranks(cluster_environment: Any) -> None:
    """Put this process's ranks where DeepSpeed reads them: the variables torchrun sets.

    DeepSpeed's engine refuses to start without ``LOCAL_RANK`` in the environment ("DeepSpeed
    requires the LOCAL_RANK environment variable"), and launchers other than torchrun and
    Lightning's own, SLURM's ``srun`` among them, do not set it (seen under SLURMEnvironment,
    2 tasks on CPU). The cluster environment is what Lightning built the process group from, so
    its view is the one to export.
    """
    _run.environment.update(
        {
            "RANK": str(cluster_environment.global_rank()),
            "LOCAL_RANK": str(cluster_environment.local_rank()),
            "WORLD_SIZE": str(cluster_environment.world_size()),
            "MASTER_ADDR": str(cluster_environment.main_address),
            "MASTER_PORT": str(cluster_environment.main_port),
        }
    )
