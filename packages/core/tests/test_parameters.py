"""Shared parameter checks, parameter docs read from source, and backend requirements."""

from __future__ import annotations

import pytest

from lightning_strategies.backends import require_backend
from lightning_strategies.describe import parameter_docs
from lightning_strategies.errors import MissingBackendError
from lightning_strategies.parameters import (
    ObsoleteParameterWarning,
    check_choice,
    check_type,
    warn_obsolete_parameter,
)


def test_check_choice_lists_the_allowed_values():
    assert check_choice("S", "stage", 2, (0, 1, 2, 3)) == 2
    with pytest.raises(ValueError, match=r"S\(stage=4\) is not valid. Choose one of: 0, 1, 2, 3."):
        check_choice("S", "stage", 4, (0, 1, 2, 3))


def test_check_type_names_the_expected_type_and_refuses_bool_for_int():
    assert check_type("S", "bucket", 10, int) == 10
    with pytest.raises(TypeError, match="must be int, not bool"):
        check_type("S", "bucket", True, int)
    with pytest.raises(TypeError, match="must be int or float, not str"):
        check_type("S", "ratio", "0.5", (int, float))


def test_obsolete_parameters_warn_with_the_reason():
    with pytest.warns(ObsoleteParameterWarning, match=r"S\(old=1\) has no effect: gone since 2.0"):
        warn_obsolete_parameter("S", "old", 1, "gone since 2.0")


def test_missing_backend_error_gives_the_install_line():
    with pytest.raises(MissingBackendError, match="pip install 'surely-not-installed-backend'"):
        require_backend(
            "surely_not_installed_backend",
            backend_distribution="surely-not-installed-backend",
            strategy_distribution="lightning-strategies",
        )


def test_backend_out_of_the_declared_range_is_refused(monkeypatch):
    # lightning-strategies itself declares pluggy>=1.3; pretend an older pluggy is installed.
    monkeypatch.setattr("lightning_strategies.backends.installed_version", lambda name: "1.0.0")
    with pytest.raises(MissingBackendError, match=r"supports pluggy>=1.3, but pluggy 1.0.0 is installed"):
        require_backend("pluggy", backend_distribution="pluggy", strategy_distribution="lightning-strategies")


def test_parameter_docs_come_from_the_source():
    docs = {doc.name: doc for doc in parameter_docs("lightning_strategies.conformance.suite:ConformanceSuite")}
    assert "options" in docs
    assert parameter_docs("lightning_strategies.nowhere:Nothing") == []


def test_a_range_can_be_given_for_backends_installed_without_dependencies(monkeypatch):
    monkeypatch.setattr("lightning_strategies.backends.installed_version", lambda name: "0.4.0")
    with pytest.raises(MissingBackendError, match=r"supports pluggy<0.6,>=0.5, but pluggy 0.4.0 is installed"):
        require_backend(
            "pluggy",
            backend_distribution="pluggy",
            strategy_distribution="lightning-strategies",
            supported=">=0.5,<0.6",
        )
