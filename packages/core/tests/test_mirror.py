"""One strategy source serves lightning.pytorch and the standalone pytorch_lightning package."""

from __future__ import annotations

import textwrap

from conftest import write_distribution

from lightning_strategies.entries import StrategyEntry, import_target
from lightning_strategies.mirror import mirrored_source

STRATEGY = {
    "mirror_me.__init__": "",
    "mirror_me.helpers": """
        from lightning.pytorch.plugins.precision import Precision

        def default_precision():
            return Precision()
    """,
    "mirror_me.strategy": """
        from lightning.pytorch.strategies import DDPStrategy
        from mirror_me.helpers import default_precision
        from . import helpers

        class MirroredStrategy(DDPStrategy):
            def __init__(self, **kwargs):
                super().__init__(precision_plugin=default_precision(), **kwargs)
                self.helpers = helpers
    """,
}


def test_source_is_rewritten_for_the_standalone_packages():
    source = textwrap.dedent("""
        import lightning.pytorch as pl
        from lightning.fabric.utilities import rank_zero_only
        from mirror_me.helpers import x
        import mirror_me.helpers
        text = "lightning_strategies is not rewritten in mirror_me strings"
    """)
    rewritten = mirrored_source(source, "pytorch_lightning", "mirror_me")
    assert "import pytorch_lightning as pl" in rewritten
    assert "from lightning_fabric.utilities import rank_zero_only" in rewritten
    assert "from lightning_strategies._mirror.pytorch_lightning.mirror_me.helpers import x" in rewritten
    assert "import lightning_strategies._mirror.pytorch_lightning.mirror_me.helpers" in rewritten
    assert '"lightning_strategies is not rewritten in mirror_me strings"' in rewritten


def test_a_mirrored_class_builds_on_pytorch_lightning(tmp_path, on_path):
    on_path(write_distribution(tmp_path / "site", "mirror-dist", STRATEGY, {}))
    import pytorch_lightning

    entry = StrategyEntry("mirrored", "mirror_me.strategy:MirroredStrategy")
    standalone = entry.load_class("pytorch_lightning")
    assert issubclass(standalone, pytorch_lightning.strategies.DDPStrategy)
    strategy = standalone()
    assert isinstance(strategy.precision_plugin, pytorch_lightning.plugins.precision.Precision)
    assert strategy.helpers.__name__ == "lightning_strategies._mirror.pytorch_lightning.mirror_me.helpers"
    assert import_target(entry.target_for("pytorch_lightning")) is standalone
