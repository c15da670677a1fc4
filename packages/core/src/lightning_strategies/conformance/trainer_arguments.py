"""Trainer arguments the conformance kit's runs share; a module of its own, importing neither torch nor Lightning,
so the test kit (``lightning_strategies.testing``) can offer them to packages' scripts without either."""

from __future__ import annotations

from typing import Any

__all__ = ["QUIET_TRAINER"]

# Trainer arguments for a run whose output is what it records, not what Lightning prints or logs. Checkpointing
# stays each run's own choice: some runs check the checkpoints Lightning writes.
QUIET_TRAINER: dict[str, Any] = {
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
}
