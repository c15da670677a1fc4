"""Every private name of Lightning and torch that core touches, looked up on the installed (pinned) versions.

A pin raised past a version that renamed one fails here, naming the internal and the file that relies on it,
instead of in the field. docs/internals.md mirrors this table: keep the two together.
"""

from __future__ import annotations

import types
import warnings

import pytest

from lightning_strategies import activation
from lightning_strategies.testing import check_internal

TRAINER_CONNECTOR = "lightning.pytorch.trainer.connectors.accelerator_connector:_AcceleratorConnector"
FABRIC_CONNECTOR = "lightning.fabric.connector:_Connector"
CONNECTOR_STEPS = (
    "_check_config_and_set_final_flags",
    "_set_parallel_devices_and_init_accelerator",
    "_check_strategy_and_fallback",
    "_init_strategy",
)

# (owner module:dotted path, how it is used, the file of ours that relies on it)
# kinds: "callable"; "instance attribute" (the owner's source assigns self.<name>); "value" (exists).
INTERNALS = [
    *[
        (f"{connector}.{step}", "callable", "activation.py")
        for connector in (TRAINER_CONNECTOR, FABRIC_CONNECTOR)
        for step in CONNECTOR_STEPS
    ],
    *[
        (f"{connector}.{flag}", "instance attribute", "activation.py")
        for connector in (TRAINER_CONNECTOR, FABRIC_CONNECTOR)
        for flag in ("_strategy_flag", "_accelerator_flag")
    ],
    (f"{TRAINER_CONNECTOR}._precision_flag", "instance attribute", "activation.py"),
    (f"{FABRIC_CONNECTOR}._precision_input", "instance attribute", "activation.py"),
    (f"{TRAINER_CONNECTOR}._registered_strategies", "instance attribute", "activation.py"),
    ("lightning.pytorch.strategies:FSDPStrategy._registered_strategies", "value", "activation.py"),
    ("lightning.fabric.connector:_FSDP_ALIASES", "value", "activation.py"),
    ("torch.distributed.distributed_c10d:_get_default_store", "callable", "ranks.py"),
]


@pytest.mark.parametrize(("internal", "kind", "used_in"), INTERNALS, ids=[row[0] for row in INTERNALS])
def test_the_internal_is_there(internal, kind, used_in):
    check_internal(internal, kind, used_in)


def test_a_connector_step_gone_is_a_warning_and_lightning_imports_on():
    """The connector steps are replaced at Lightning's import: a Lightning without one must not fail that import,
    and the user must see which internal is missing, not only a log line."""
    module = types.ModuleType("lightning.fabric.connector")
    module._Connector = type("_Connector", (), {})  # none of the steps
    with pytest.warns(activation.ActivationWarning, match=r"lightning\.fabric\.connector.*_check_config_and_set"):
        activation.on_lightning_import("lightning.fabric.connector", module)


def test_warnings_made_errors_do_not_break_lightnings_import(caplog):
    module = types.ModuleType("lightning.fabric.connector")
    module._Connector = type("_Connector", (), {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        activation.on_lightning_import("lightning.fabric.connector", module)
    assert "_check_config_and_set_final_flags" in caplog.text
