"""Every private name of Lightning and DeepSpeed that this package touches, looked up on the
installed (pinned) versions.

A pin raised past a version that renamed one fails here, naming the internal and the file that relies on it,
instead of in the field. docs/internals.md mirrors this table: keep the two together.
"""

from __future__ import annotations

import pytest

from lightning_strategies.testing import check_internal

STAGE_3 = "deepspeed.runtime.zero.stage3:DeepSpeedZeroOptimizer_Stage3"

# (owner module:dotted path, kind, the file of ours that relies on it)
# ZeRO-3's public-looking attributes are listed too: gradient_buffers.py reads some with a default, so a
# rename would turn its replacement off without a word.
# kinds: "callable"; "instance attribute" (the owner's source assigns self.<name>); "value" (exists).
INTERNALS = [
    ("lightning.fabric.utilities.cloud_io:_is_local_file_protocol", "callable", "body.py"),
    ("lightning.pytorch.core.optimizer:_init_optimizers_and_lr_schedulers", "callable", "strategy.py"),
    ("lightning.pytorch.loops.fit_loop:_FitLoop._data_source", "instance attribute", "strategy.py"),
    ("lightning.pytorch.strategies:DDPStrategy._process_group_backend", "instance attribute", "body.py"),
    ("lightning.pytorch.plugins.precision:Precision._after_closure", "callable", "precision.py"),
    ("deepspeed.runtime.engine:DeepSpeedEngine._config", "instance attribute", "checkpoint.py"),
    *[
        (f"{STAGE_3}.{name}", "instance attribute", "gradient_buffers.py")
        for name in (
            "__param_id_to_grad_partition",  # name-mangled
            "offload_optimizer",
            "swap_optimizer",
            "dtype",
            "grad_partitions_flat_buffer",
            "fp16_groups",
            "fp32_partitioned_groups_flat",
            "grad_position",
        )
    ],
    (f"{STAGE_3}.get_param_id", "callable", "gradient_buffers.py"),
]


@pytest.mark.parametrize(("internal", "kind", "used_in"), INTERNALS, ids=[row[0] for row in INTERNALS])
def test_the_internal_is_there(internal, kind, used_in):
    check_internal(internal, kind, used_in)


def test_where_checkpoint_engines_can_be_decoupled_the_engine_commits_them():
    """checkpoint.py commits only where the checkpoint engine says it is decoupled, which older DeepSpeeds cannot."""
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

    if not hasattr(CheckpointEngine, "is_decoupled"):
        pytest.skip("this DeepSpeed has no decoupled checkpoint engines: checkpoint.py never commits one")
    check_internal("deepspeed.runtime.engine:DeepSpeedEngine._commit_decoupled_checkpoint", "callable", "checkpoint.py")
