"""A package's classes import on first use (``backends.lazy_exports``), so importing the package stays cheap."""

from __future__ import annotations

import pytest

from lightning_strategies.backends import lazy_exports
from lightning_strategies.testing import run_script


def test_a_name_is_imported_from_its_module_on_first_use() -> None:
    module_getattr = lazy_exports("acme_strategy", {"OrderedDict": "collections", "missing": "collections"})
    from collections import OrderedDict

    assert module_getattr("OrderedDict") is OrderedDict
    with pytest.raises(AttributeError, match="'collections' has no attribute 'missing'"):
        module_getattr("missing")
    with pytest.raises(AttributeError, match="module 'acme_strategy' has no attribute 'Other'"):
        module_getattr("Other")


@pytest.mark.parametrize(
    ("package", "name", "backend"),
    [
        ("lightning_strategies_deepspeed", "DeepSpeedStrategy", "lightning_strategies_deepspeed.strategy"),
        ("lightning_strategies_xla", "XLAStrategy", "lightning_strategies_xla.strategy"),
    ],
)
def test_importing_a_package_imports_no_strategy_module(package: str, name: str, backend: str) -> None:
    pytest.importorskip(package)
    code = f"import sys, {package} as p; print({backend!r} in sys.modules, {name!r} in p.__all__, hasattr(p, 'Nope'))"
    result = run_script("-c", code, env={"LIGHTNING_STRATEGIES_AUTOLOAD": "0"}, timeout=300)
    assert result.stdout.split() == ["False", "True", "False"]
