"""Every private name of Lightning and ColossalAI that this package touches, looked up on the
installed (pinned) versions.

A pin raised past a version that renamed one fails here, naming the internal and the file that relies on it,
instead of in the field. docs/internals.md mirrors this table: keep the two together.
"""

from __future__ import annotations

import pytest

from lightning_strategies.testing import check_internal

pytest.importorskip("colossalai")

# (owner module:dotted path, kind, the file of ours that relies on it)
# kinds: "callable"; "instance attribute" (the owner's source assigns self.<name>); "value" (exists).
INTERNALS = [
    ("colossalai.kernel.extensions.base_extension:_Extension.get_jit_extension_folder_path", "callable", "kernels.py"),
    ("colossalai.lazy.lazy_init:LazyTensor._materialized_data", "instance attribute", "lazy_init.py"),
    ("colossalai.lazy.lazy_init:LazyTensor._op_buffer", "instance attribute", "lazy_init.py"),
    ("colossalai.lazy.lazy_init:LazyTensor._materialize_data", "callable", "lazy_init.py"),
    ("colossalai.lazy.lazy_init:LazyTensor.__torch_function__", "callable", "lazy_init.py"),
    ("colossalai.lazy.construction:ConstructorManager.overwrites", "value", "lazy_init.py"),
    ("colossalai.zero.gemini.placement_policy:PlacementPolicyFactory.policies", "value", "static_placement.py"),
    ("lightning.pytorch.plugins.precision:Precision._after_closure", "callable", "precision.py"),
    (
        "lightning.pytorch.core.optimizer:LightningOptimizer._optimizer",
        "instance attribute",
        "strategy.py, sharded_checkpoint.py",
    ),
    ("lightning.pytorch.core.module:LightningModule._trainer", "instance attribute", "strategy.py"),
]


@pytest.mark.parametrize(("internal", "kind", "used_in"), INTERNALS, ids=[row[0] for row in INTERNALS])
def test_the_internal_is_there(internal, kind, used_in):
    check_internal(internal, kind, used_in)
