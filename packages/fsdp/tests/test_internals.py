"""Every private name of Lightning and torch that this package touches, looked up on the
installed (pinned) versions.

A pin raised past a version that renamed one fails here, naming the internal and the file that relies on it,
instead of in the field. docs/internals.md mirrors this table: keep the two together.
"""

from __future__ import annotations

import pytest

from lightning_strategies.testing import check_internal

# (owner module:dotted path, kind, the file of ours that relies on it)
# kinds: "callable"; "instance attribute" (the owner's source assigns self.<name>); "value" (exists).
INTERNALS = [
    ("lightning.fabric.utilities.distributed:_distributed_is_initialized", "callable", "body.py"),
    ("lightning.fabric.utilities.distributed:_sync_ddp_if_available", "callable", "body.py"),
    (
        "lightning.fabric.utilities.distributed:_get_default_process_group_backend_for_device",
        "callable",
        "process_group.py",
    ),
    ("lightning.fabric.utilities.distributed:_init_dist_connection", "callable", "process_group.py"),
    ("lightning.fabric.strategies.launchers.subprocess_script:_SubprocessScriptLauncher", "callable", "fabric.py"),
    ("lightning.fabric.strategies.strategy:_BackwardSyncControl", "callable", "fabric.py"),
    ("lightning.fabric.utilities.optimizer:_optimizers_to_device", "callable", "strategy.py"),
    ("lightning.pytorch.strategies.launchers.subprocess_script:_SubprocessScriptLauncher", "callable", "strategy.py"),
    ("lightning.pytorch.core.optimizer:LightningOptimizer._optimizer", "instance attribute", "strategy.py"),
    ("lightning.pytorch.strategies:Strategy._reset_optimizers_and_schedulers", "callable", "strategy.py"),
    ("lightning.pytorch.strategies:Strategy._checkpoint_io", "instance attribute", "body.py"),
    ("torch.distributed.fsdp.wrap:ModuleWrapPolicy._module_classes", "instance attribute", "sharding.py"),
    ("torch.distributed.fsdp.wrap:ModuleWrapPolicy._run_policy", "callable", "sharding.py"),
    ("torch.distributed._composable:checkpoint", "callable", "sharding.py"),
    ("torch.distributed.tensor._utils:compute_local_shape_and_global_offset", "callable", "sharding.py"),
    ("torch.serialization:_get_layout", "callable", "validation.py"),
    ("torch.distributed.fsdp:ShardingStrategy._HYBRID_SHARD_ZERO2", "value", "options.py"),
]


@pytest.mark.parametrize(("internal", "kind", "used_in"), INTERNALS, ids=[row[0] for row in INTERNALS])
def test_the_internal_is_there(internal, kind, used_in):
    check_internal(internal, kind, used_in)
