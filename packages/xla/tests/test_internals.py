"""Every private name of Lightning and torch_xla that this package touches, looked up on the
installed (pinned) versions.

A pin raised past a version that renamed one fails here, naming the internal and the file that relies on it,
instead of in the field. docs/internals.md mirrors this table: keep the two together.
torch_xla's are looked up only where it is installed (the xla test session); Lightning's everywhere.
"""

from __future__ import annotations

import pytest

from lightning_strategies.testing import check_internal

# (owner module:dotted path, kind, the file of ours that relies on it)
# kinds: "callable"; "instance attribute" (the owner's source assigns self.<name>); "value" (exists).
INTERNALS = [
    ("lightning.fabric.utilities.types:_PATH", "value", "body.py, fabric.py, strategy.py"),
    ("lightning.fabric.utilities.device_parser:_check_data_type", "callable", "accelerator.py"),
    ("lightning.fabric.plugins.precision.utils:_convert_fp_tensor", "callable", "dtypes.py"),
    ("lightning.fabric.plugins.precision.utils:_DtypeContextManager", "callable", "dtypes.py"),
    ("lightning.fabric.plugins.precision.precision:_PRECISION_INPUT_STR", "value", "dtypes.py"),
    ("lightning.pytorch.plugins.precision:Precision._wrap_closure", "callable", "precision.py"),
    ("lightning.pytorch.plugins.precision:XLAPrecision._xla_wrap_closure", "callable", "precision.py"),
    ("lightning.pytorch.strategies:Strategy._precision_plugin", "instance attribute", "strategy.py"),
    ("lightning.pytorch.strategies:XLAStrategy._launched", "instance attribute", "body.py"),
    ("lightning.fabric.strategies:XLAFSDPStrategy._state_dict_type", "instance attribute", "fabric.py"),
]


@pytest.mark.parametrize(("internal", "kind", "used_in"), INTERNALS, ids=[row[0] for row in INTERNALS])
def test_the_internal_is_there(internal, kind, used_in):
    check_internal(internal, kind, used_in)


@pytest.mark.parametrize("name", ["num_available_chips", "num_available_devices"])
def test_torch_xla_counts_devices_where_devices_py_asks(name):
    pytest.importorskip("torch_xla._internal.tpu")
    check_internal(f"torch_xla._internal.tpu:{name}", "callable", "devices.py")
