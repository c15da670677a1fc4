"""Lightning's words first (issue 32): a strategy name Lightning's connectors would call invalid gets ours, a
``StrategyLookupError`` (a ValueError, as Lightning's), that begins with Lightning's first sentence; Lightning's list
of example choices gives way to our close matches and install lines.

Lightning's text is read from the installed Lightning: its connector's own check, which core wraps, run on the same
name with Lightning's registry as it stands without ours.
"""

from __future__ import annotations

from typing import Any

import pytest

from lightning_strategies import activate, hookimpl
from lightning_strategies.errors import StrategyLookupError
from lightning_strategies.known import PROJECT_PACKAGES
from lightning_strategies.testing import assert_raises_as_lightning, lightnings_strategy_name_check


def _ours(entry_point: str, name: str) -> Any:
    if entry_point == "Trainer":
        import lightning.pytorch as pl

        return pl.Trainer(strategy=name, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    import lightning.fabric

    return lightning.fabric.Fabric(strategy=name, accelerator="cpu", devices=1)


class _TeamDDP:
    @hookimpl
    def register_strategies(registry):
        registry.register(
            "team_ddp",
            "lightning.pytorch.strategies:DDPStrategy",
            fabric_target="lightning.fabric.strategies:DDPStrategy",
        )


@pytest.mark.parametrize("entry_point", ["Trainer", "Fabric"])
@pytest.mark.parametrize("name", ["team_dpp", "no_such_strategy", "TEAM_DPP"])
def test_an_unknown_name(registry, add_plugin, lightning_registries, entry_point: str, name: str) -> None:
    add_plugin(_TeamDDP)
    activate()
    error = assert_raises_as_lightning(
        lambda: lightnings_strategy_name_check(name, entry_point), lambda: _ours(entry_point, name), sentences=1
    )
    assert isinstance(error, StrategyLookupError)
    if name.lower() == "team_dpp":
        assert "Did you mean: 'team_ddp'" in str(error)


@pytest.mark.parametrize("entry_point", ["Trainer", "Fabric"])
def test_a_name_of_a_package_that_is_not_installed(registry, lightning_registries, entry_point: str) -> None:
    """The names of this project's packages are placeholders in Lightning's registry while the package is missing;
    Lightning alone would call them invalid."""
    name = "colossalai"
    assert name in PROJECT_PACKAGES["lightning-strategies-colossalai-gemini"]
    for lightning_registry in lightning_registries:  # an earlier activation's entry, with the package installed
        lightning_registry.pop(name, None)
    activate()
    error = assert_raises_as_lightning(
        lambda: lightnings_strategy_name_check(name, entry_point), lambda: _ours(entry_point, name), sentences=1
    )
    assert "pip install lightning-strategies-colossalai-gemini" in str(error)


def test_a_name_whose_plugin_is_gone_since_activation(registry, add_plugin, lightning_registries) -> None:
    """Lightning's registry keeps the lazy entry of a name whose plugin core no longer has (a registry reloaded
    without it): resolving it is Lightning's invalid name too."""
    add_plugin(_TeamDDP)
    activate()
    registry._entries.pop("team_ddp")
    error = assert_raises_as_lightning(
        lambda: lightnings_strategy_name_check("team_ddp"), lambda: _ours("Trainer", "team_ddp"), sentences=1
    )
    assert isinstance(error, StrategyLookupError)
