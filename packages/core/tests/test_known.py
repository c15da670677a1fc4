"""The static name lists core uses without importing Lightning agree with Lightning itself."""

from __future__ import annotations

import subprocess
import sys

from lightning_strategies.known import LIGHTNING_FABRIC_NAMES, LIGHTNING_TRAINER_NAMES


def test_builtin_names_match_lightnings_registries_per_entry_point():
    # A fresh interpreter with activation off sees Lightning's registries as Lightning made them.
    code = (
        "from lightning.pytorch.strategies import StrategyRegistry as trainer;"
        "from lightning.fabric.strategies import STRATEGY_REGISTRY as fabric;"
        "print(' '.join(sorted(trainer))); print(' '.join(sorted(fabric)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"LIGHTNING_STRATEGIES_AUTOLOAD": "0", "PATH": ""},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    trainer, fabric = result.stdout.splitlines()
    assert set(trainer.split()) == LIGHTNING_TRAINER_NAMES
    assert set(fabric.split()) == LIGHTNING_FABRIC_NAMES
