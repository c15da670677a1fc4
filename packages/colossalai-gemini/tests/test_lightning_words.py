"""Lightning's words first (issue 32). Lightning has no ColossalAI strategy, so it raises nothing for Gemini itself;
where Gemini refuses what Lightning refuses for its own sharded strategies (DeepSpeed, FSDP), ours says it in
Lightning's words first, read here from the installed Lightning. A name of this package while it is not installed
is core's (packages/core/tests/test_lightning_words.py); what ours refuses beyond Lightning is listed in
docs/lightning-compatibility.md.
"""

from __future__ import annotations

import types
from unittest.mock import Mock

from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.strategies import FSDPStrategy

from lightning_strategies.testing import assert_raises_as_lightning
from lightning_strategies_colossalai.strategy import ColossalAIStrategy


def test_stochastic_weight_averaging_of_a_sharded_model() -> None:
    callback = StochasticWeightAveraging(swa_lrs=0.1)
    lightnings_sharded = types.SimpleNamespace(strategy=Mock(spec=FSDPStrategy), callbacks=[callback])
    assert_raises_as_lightning(
        lambda: callback.setup(lightnings_sharded, Mock(), "fit"),
        lambda: ColossalAIStrategy.refuse_weight_averaging(types.SimpleNamespace(callbacks=[callback])),
    )
