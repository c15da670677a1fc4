"""Shared parameter checks, parameter docs read from source, and backend requirements."""

from __future__ import annotations

import inspect

import pytest

from lightning_strategies.backends import require_backend
from lightning_strategies.describe import parameter_docs
from lightning_strategies.errors import MissingBackendError
from lightning_strategies.parameters import (
    ObsoleteParameterWarning,
    check_choice,
    check_type,
    constructor_for,
    rename_parameter,
    warn_obsolete_parameter,
)
from lightning_strategies.testing import check_trainer_and_fabric_agree


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


class _Base:
    def __init__(self, precision_plugin: object = None) -> None:
        self.given = precision_plugin


class _Body:
    def __init__(self, stage: int = 2, precision: object = None, *, debug: bool = False) -> None:
        super().__init__(precision_plugin=precision)  # type: ignore[call-arg]
        self.stage, self.debug = stage, debug


class _Face(_Body, _Base):
    __init__ = rename_parameter(_Body.__init__, "precision", "precision_plugin")


def test_a_renamed_constructor_is_the_body_under_the_faces_name() -> None:
    assert list(inspect.signature(_Face).parameters) == ["stage", "precision_plugin", "debug"]
    assert inspect.signature(_Face).parameters["debug"].default is False
    face = _Face(3, "plugin", debug=True)
    assert (face.stage, face.given, face.debug) == (3, "plugin", True)  # super() inside still skips the body
    assert _Face(precision_plugin="by name").given == "by name"
    with pytest.raises(TypeError, match="precision"):
        _Face(precision="the other entry point's name")
    assert "precision" in inspect.signature(_Body).parameters  # the body keeps its own
    with pytest.raises(ValueError, match=r"'accuracy' must be one of its parameters \(self, stage, precision, debug\)"):
        rename_parameter(_Body.__init__, "accuracy", "precision_plugin")


class _TrainerFace(_Body, _Base):
    __init__ = constructor_for(__qualname__, _Body.__init__, precision="precision_plugin")


class _FabricFace(_Body, _Base):
    __init__ = constructor_for(__qualname__, _Body.__init__)


def test_each_face_constructor_is_the_body_under_the_faces_own_name() -> None:
    """Python words a wrong call after the code's qualified name: the face the user called, never the body."""
    assert list(inspect.signature(_TrainerFace).parameters) == ["stage", "precision_plugin", "debug"]
    assert inspect.signature(_FabricFace) == inspect.signature(_Body)
    face = _TrainerFace(3, "plugin", debug=True)
    assert (face.stage, face.given, face.debug) == (3, "plugin", True)  # super() inside still skips the body
    assert _FabricFace(precision="plugin").given == "plugin"
    for face_class, name in [(_TrainerFace, "_TrainerFace"), (_FabricFace, "_FabricFace")]:
        assert face_class.__init__.__qualname__ == f"{name}.__init__"
        with pytest.raises(TypeError, match=rf"^{name}\.__init__\(\) got an unexpected keyword argument 'stag'"):
            face_class(stag=3)
        with pytest.raises(TypeError, match=rf"^{name}\.__init__\(\) got multiple values for argument 'stage'"):
            face_class(1, stage=2)
    with pytest.raises(TypeError, match=r"^_TrainerFace\.__init__\(\) got an unexpected keyword argument 'precision'"):
        _TrainerFace(precision="the other entry point's name")
    assert _Body.__init__.__qualname__ == "_Body.__init__"  # the body keeps its own
    with pytest.raises(ValueError, match=r"constructor_for\('_Face', _Body.__init__, accuracy='precision_plugin'\): "):
        constructor_for("_Face", _Body.__init__, accuracy="precision_plugin")
    with pytest.raises(ValueError, match=r"'debug' a name it does not use yet"):
        constructor_for("_Face", _Body.__init__, precision="debug")


def test_check_trainer_and_fabric_agree_names_the_parameter_that_differs() -> None:
    class _Fabric(_Body):
        pass

    check_trainer_and_fabric_agree(_Face, _Fabric)

    class _Drifted(_Body):
        def __init__(self, stage: int = 3, precision: object = None, *, debug: bool = False) -> None: ...

    with pytest.raises(AssertionError, match="stage: "):
        check_trainer_and_fabric_agree(_Face, _Drifted)

    class _Hidden(_Body):
        def __init__(self, **options: object) -> None: ...

    with pytest.raises(AssertionError, match=r"takes \[.\*\*options: .*name each option"):
        check_trainer_and_fabric_agree(_Face, _Hidden)


def test_parameter_docs_follow_a_shared_body_and_its_renaming(tmp_path, monkeypatch) -> None:
    package = tmp_path / "two_faces"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "body.py").write_text(
        "class Body:\n"
        "    def __init__(self, stage=2, precision=None):\n"
        '        """Args:\n            stage: The ZeRO stage.\n        """\n'
    )
    (package / "faces.py").write_text(
        "from collections import OrderedDict\n"
        "from lightning_strategies import constructor_for\n"
        "from lightning_strategies.parameters import rename_parameter\n"
        "from .body import Body\n\n"
        "class Trainer(Body):\n"
        '    """Args:\n        precision_plugin: The Trainer\'s plugin.\n    """\n'
        '    __init__ = rename_parameter(Body.__init__, "precision", "precision_plugin")\n\n'
        "class Fabric(Body):\n"
        "    pass\n\n"
        "class Named(Body):\n"
        '    __init__ = constructor_for(__qualname__, Body.__init__, precision="precision_plugin", stage="level")\n\n'
        "class Elsewhere(OrderedDict):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = parameter_docs("two_faces.faces:Trainer")
    assert [(doc.name, doc.default, doc.meaning) for doc in trainer] == [
        ("stage", "2", "The ZeRO stage."),
        ("precision_plugin", "None", "The Trainer's plugin."),
    ]
    assert [doc.name for doc in parameter_docs("two_faces.faces:Fabric")] == ["stage", "precision"]
    named = parameter_docs("two_faces.faces:Named")
    assert [(doc.name, doc.meaning) for doc in named] == [("level", "The ZeRO stage."), ("precision_plugin", "")]
    assert parameter_docs("two_faces.faces:Elsewhere") == []  # a base outside the package is not looked up
