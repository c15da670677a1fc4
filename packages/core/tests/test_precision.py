"""A strategy keeps its own precision plugin through Lightning's connector."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_strategies.precision import OwnPrecisionMixin, is_stock_precision


class TaggedPrecision(Precision):
    def __init__(self, precision: str) -> None:
        super().__init__()
        self.precision = precision


class OwnPrecisionStrategy(OwnPrecisionMixin, SingleDeviceStrategy):
    def __init__(self, **kwargs):
        super().__init__(device="cpu", **kwargs)

    def own_precision_plugin(self, precision: str) -> Precision:
        return TaggedPrecision(precision)


def _trainer(strategy, **options):
    return pl.Trainer(strategy=strategy, accelerator="cpu", logger=False, enable_checkpointing=False, **options)


def test_lightnings_default_becomes_the_strategys_own_plugin():
    trainer = _trainer(OwnPrecisionStrategy(), precision="bf16-mixed")
    assert isinstance(trainer.strategy.precision_plugin, TaggedPrecision)
    assert trainer.strategy.precision_plugin.precision == "bf16-mixed"


def test_a_plugin_given_to_the_strategy_is_kept():
    given = TaggedPrecision("given")
    trainer = _trainer(OwnPrecisionStrategy(precision_plugin=given), precision="bf16-mixed")
    assert trainer.strategy.precision_plugin is given


def test_stock_plugins_are_told_from_user_subclasses():
    assert is_stock_precision(MixedPrecision("bf16-mixed", "cpu"))
    assert not is_stock_precision(TaggedPrecision("32-true"))
