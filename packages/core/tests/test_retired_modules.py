"""Importing the module of a retired Lightning integration that one of this project's packages replaces fails with
the import to use (and, where that package is missing, the install line); any other import is left alone."""

from __future__ import annotations

import _lightning_strategies_autoload as autoload
import pytest

RETIRED = "lightning_retired_integration_for_tests"


@pytest.fixture
def retired_module(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = ("lightning-retired", "lightning-strategies-missing", "lightning_strategies_missing", "OldStrategy", "old")
    monkeypatch.setitem(autoload.RETIRED_MODULES, RETIRED, entry)
    autoload.install()


def test_the_error_names_the_import_to_use_and_the_install_line(retired_module: None) -> None:
    with pytest.raises(ModuleNotFoundError) as refused:
        __import__(RETIRED)
    assert refused.value.name == RETIRED
    message = str(refused.value)
    assert message.startswith(f"No module named {RETIRED!r}: that is the lightning-retired project")
    assert "`from lightning.pytorch.strategies import OldStrategy`" in message
    assert "`from lightning_strategies_missing import OldStrategy`" in message
    assert message.endswith("Install it first: pip install lightning-strategies-missing")


def test_other_missing_modules_fail_as_python_says(retired_module: None) -> None:
    with pytest.raises(ModuleNotFoundError, match=r"^No module named 'lightning_not_retired_for_tests'$"):
        __import__("lightning_not_retired_for_tests")
