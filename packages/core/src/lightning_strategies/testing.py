"""The test kit every strategy package's tests share, and plugin authors' too: a free port for a process
group, a runner for scripts that launch ranks of their own, stand-ins for other packages' checkpoint layouts,
a way to record what a call raised (for checks run in a fresh process), and the checks every package makes of
its own plugin against core (install hints, checkpoint layouts).

The same pieces are fixtures of core's pytest plugin (``free_port``, ``run_script``), loaded wherever
lightning-strategies is installed. Importing this module imports neither torch nor Lightning.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_strategies.conformance.launching import fresh_launch_environment
from lightning_strategies.conformance.trainer_arguments import QUIET_TRAINER
from lightning_strategies.hookspecs import hookimpl

if TYPE_CHECKING:
    from lightning_strategies.checkpoints import CheckpointFormat
    from lightning_strategies.registry import StrategyRegistry

__all__ = [
    "QUIET_TRAINER",
    "ScriptFailed",
    "another_packages_checkpoint",
    "assert_install_hints_match",
    "assert_layout_identified_only_through",
    "assert_raises_as_lightning",
    "check_internal",
    "check_lightning_cli_builds",
    "check_trainer_and_fabric_agree",
    "described",
    "error_of",
    "free_port",
    "lightnings_strategy_name_check",
    "process_state",
    "raised_by",
    "record_checks",
    "run_script",
    "side_effects_of_runs",
    "state_changes",
    "written_by_another_package",
]

# How ``written_by_another_package`` describes a checkpoint, for tests to look for in a refusal.
ANOTHER_PACKAGE = {
    "description": "another package's checkpoint",
    "read_by": "another package's strategies",
    "to_full_weights": "`another-package-convert {path} full.ckpt` writes one file of full weights",
}

# Enough of a failed run's output to show the traceback and what the other ranks said before it.
OUTPUT_TAIL = 6000


class ScriptFailed(AssertionError):
    """A launched script exited non-zero; the message ends with the tail of what it wrote."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a rendezvous (``MASTER_PORT``, ``tcp://``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_script(
    *arguments: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
    timeout: float = 600,
    check: bool = True,
    tail: int = OUTPUT_TAIL,
) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with ``arguments`` (a script and its arguments, or ``-m module ...``, ``-c code``)
    in a fresh process, and return what it wrote.

    The environment is this process's without a previous run's rendezvous (``fresh_launch_environment``),
    plus ``env``, less the variables in ``unset``: ranks the script launches form a new group instead of
    reusing this process's port. With ``check``, a non-zero exit raises ``ScriptFailed`` ending with the
    last ``tail`` characters of stdout and of stderr; without it, the caller inspects the result.
    """
    command = [sys.executable, *map(str, arguments)]
    environment = fresh_launch_environment(env)
    for name in unset:
        environment.pop(name, None)
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)
    if check and completed.returncode != 0:
        raise ScriptFailed(
            f"{' '.join(command)} exited with {completed.returncode}.\n"
            f"--- stdout (last {tail} characters) ---\n{completed.stdout[-tail:]}\n"
            f"--- stderr (last {tail} characters) ---\n{completed.stderr[-tail:]}"
        )
    return completed


def side_effects_of_runs(
    names: Sequence[str],
    *,
    fabric: bool = False,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
    timeout: float = 600,
) -> dict[str, dict[str, list[str | None]]]:
    """What runs under each of ``names`` leave changed in the process: ``{name: {what: [before, after]}}``, an
    empty dict for a name whose runs changed nothing.

    One fresh process (``run_script``'s, with ``env`` and ``unset``) runs Lightning's own ``ddp`` once, so what
    Lightning itself leaves set is set already, then each name on one CPU device: ``fit``, ``validate``, ``test``
    and ``predict`` with the Trainer, or with ``fabric`` a model set up and stepped, then dropped (Fabric never
    tears its strategy down). ``options`` adds constructor keywords per name. Compared: ``os.environ``, torch's
    process-wide switches, the levels of existing loggers, Lightning's strategy registries (``process_state``).
    """
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "side-effects.json"
        command: list[str | os.PathLike[str]] = ["-m", "lightning_strategies.conformance.side_effects", out, *names]
        if fabric:
            command.append("--fabric")
        if options:
            command += ["--options", json.dumps(options)]
        run_script(*command, env=env, unset=unset, timeout=timeout)
        return dict(json.loads(out.read_text()))


def process_state() -> dict[str, str]:
    """What a strategy could leave changed for the rest of the process, each as a string: ``os.environ``, torch's
    default dtype, grad mode, deterministic algorithms and threads, the loggers' levels, and the entries of
    Lightning's strategy registries that are imported. Compare two with ``state_changes``."""
    from lightning_strategies.conformance import side_effects

    return side_effects.process_state()


def state_changes(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, list[str | None]]:
    """What differs between two ``process_state()``s, as ``{what: [before, after]}``; a logger created in between
    is no change (modules create theirs when imported)."""
    from lightning_strategies.conformance import side_effects

    return side_effects.changes(dict(before), dict(after))


@contextlib.contextmanager
def checkpoint_layouts_described(*formats: CheckpointFormat, plugin: str = "layout-stand-in") -> Iterator[None]:
    """Within the block, ``identify`` knows ``formats`` as if an installed package described them.

    A package's tests run where only that package is installed, so another package's layout is unknown there;
    this stands in for that package, to test how a strategy refuses a checkpoint it cannot read.
    """
    from lightning_strategies.hooks import plugins_of
    from lightning_strategies.plugins import register_plugin
    from lightning_strategies.registry import get_registry

    class StandIn:
        @hookimpl
        def checkpoint_formats(self) -> list[CheckpointFormat]:
            return list(formats)

    registry = get_registry()
    register_plugin(registry, StandIn(), plugin)
    try:
        yield
    finally:
        plugins_of(registry).remove(plugin)
        registry.loaded_plugins.remove(plugin)


def written_by_another_package(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[None]:
    """Within the block, ``identify`` says the checkpoint at ``path`` (and anything inside it) is another installed
    package's, described by ``ANOTHER_PACKAGE``: whatever the installed packages are, a test sees how a strategy
    refuses a checkpoint it cannot read."""
    from lightning_strategies.checkpoints import CheckpointFormat

    root = Path(path)
    stand_in = CheckpointFormat(
        "another_package",
        ANOTHER_PACKAGE["description"],
        ANOTHER_PACKAGE["read_by"],
        ANOTHER_PACKAGE["to_full_weights"],
        matches=lambda candidate: candidate == root or root in candidate.parents,
    )
    return checkpoint_layouts_described(stand_in)


@contextlib.contextmanager
def another_packages_checkpoint(parent: str | os.PathLike[str]) -> Iterator[Path]:
    """Within the block, ``parent/other.ckpt`` is a folder of one shard that ``identify`` says another installed
    package wrote (``written_by_another_package``): the folder a strategy must refuse by naming its conversion."""
    path = Path(parent) / "other.ckpt"
    path.mkdir()
    (path / "shard-0").write_bytes(b"x")
    with written_by_another_package(path):
        yield path


def raised_by(call: Callable[[], object]) -> Exception | None:
    """What ``call()`` raised, or None: for a script that records refusals for a test to assert on."""
    try:
        call()
    except Exception as error:  # any refusal is a result to record, not a failure of the recording script
        return error
    return None


def described(error: BaseException | None) -> str:
    """``"TypeName: message"`` of an exception, ``"no error"`` for None: the form the JSON results hold."""
    return "no error" if error is None else f"{type(error).__name__}: {error}"


def error_of(call: Callable[[], object]) -> str:
    """``described(raised_by(call))``: what a call raised, as a recorded result says it."""
    return described(raised_by(call))


def assert_raises_as_lightning(
    lightning: Callable[[], object], ours: Callable[[], object], sentences: int | None = None
) -> Exception:
    """Hold one of our refusals against Lightning's for the same input, and return ours.

    ``lightning()`` runs Lightning's own class and must raise (else the input no longer shows Lightning's refusal);
    ``ours()`` must raise that type, or a subclass, with a message that begins with Lightning's, so that a
    ``pytest.raises(..., match=...)`` written against Lightning passes on ours. ``sentences``: where ours keeps only
    Lightning's first sentences and replaces the rest (Lightning's advice that does not hold for ours), how many.
    """
    theirs = raised_by(lightning)
    assert theirs is not None, "Lightning's call raised nothing: this input no longer shows its refusal"
    mine = raised_by(ours)
    assert mine is not None, f"Lightning raises {described(theirs)}; ours raised nothing"
    assert isinstance(mine, type(theirs)), (
        f"Lightning raises {type(theirs).__name__}; ours {type(mine).__name__}, not a subclass: {mine}"
    )
    words = str(theirs)
    if sentences is not None:
        words = " ".join(re.split(r"(?<=\.)\s+", words)[:sentences])
    assert str(mine).startswith(words), f"ours does not begin with Lightning's words.\nLightning: {words}\nOurs: {mine}"
    return mine


def lightnings_strategy_name_check(name: str, entry_point: str = "Trainer") -> None:
    """Run Lightning's own check of a ``strategy=`` name (its connector's, which core wraps) as if Lightning's registry
    held no ``name``: it raises Lightning's "invalid strategy name" error, for ``assert_raises_as_lightning``.
    ``entry_point``: "Trainer" or "Fabric"."""
    from types import SimpleNamespace

    if entry_point == "Trainer":
        from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector as connector

        extra = {"sync_batchnorm": False}
    else:
        from lightning.fabric.connector import _Connector as connector  # type: ignore[assignment]

        extra = {}
    wrapped = connector._check_config_and_set_final_flags
    check = getattr(wrapped, "__wrapped__", wrapped)  # Lightning's own, under core's wrapper
    state: Any = SimpleNamespace(_registered_strategies=[])  # all the check reads of a connector
    check(state, strategy=name, accelerator="cpu", precision=None, plugins=None, **extra)


def record_checks(checks: Mapping[str, Callable[[], Any]], out: str | os.PathLike[str]) -> None:
    """Run each check and write ``{name: {"value": ...} or {"error": "TypeName: message"}}`` as JSON to ``out``.

    A check's value is kept where it is a dict (what it measured); any other value (a Trainer, None) is
    recorded as None, meaning the check ran without an error.
    """
    results: dict[str, Any] = {}
    for name, check in checks.items():
        try:
            value = check()
            results[name] = {"value": value if isinstance(value, dict) else None}
        except Exception as error:  # the refusals are what some checks expect
            results[name] = {"error": described(error)}
    Path(out).write_text(json.dumps(results))


def assert_install_hints_match(distribution: str, registry: StrategyRegistry | None = None) -> None:
    """Core's install hints (``known.PROJECT_PACKAGES``) list exactly the names ``distribution`` registers.

    Core keeps those names to say which package to install when one is missing; this keeps them from drifting.
    ``registry`` defaults to the process-wide one, loaded from what is installed.
    """
    from lightning_strategies.known import PROJECT_PACKAGES
    from lightning_strategies.registry import get_registry

    registry = registry if registry is not None else get_registry()
    registered = {entry.name for entry in registry if entry.distribution == distribution}
    assert registered, f"{distribution} registers no strategy name here: is it installed (pip install -e)?"
    hinted = set(PROJECT_PACKAGES.get(distribution, ()))
    assert hinted == registered, (
        f"core's install hints for {distribution} differ from what it registers: "
        f"only hinted {sorted(hinted - registered)}, only registered {sorted(registered - hinted)}; "
        "update PROJECT_PACKAGES in lightning_strategies/known.py"
    )


def assert_layout_identified_only_through(
    plugin: object,
    entry_point: str,
    distribution: str,
    layout: CheckpointFormat,
    paths: Sequence[Path],
    *,
    before: Sequence[CheckpointFormat | None] | None = None,
    not_matching: Sequence[Path] = (),
) -> None:
    """Core identifies ``paths`` as ``layout`` once ``plugin`` (a package's light plugin module) is registered,
    and not before: core itself knows no package's layout.

    Without the plugin each path is identified as ``before`` says (None for each by default); with it, each is
    ``layout`` and each of ``not_matching`` is still nothing. The process-wide registry is swapped for an empty
    one for the check and put back afterwards.
    """
    from lightning_strategies import registry as registry_module
    from lightning_strategies.checkpoints import identify
    from lightning_strategies.plugins import register_plugin

    expected_before = list(before) if before is not None else [None] * len(paths)
    saved = registry_module._registry
    registry_module._registry = registry_module.StrategyRegistry()
    try:
        found = [identify(path) for path in paths]
        assert found == expected_before, f"without {entry_point}'s plugin, core identifies {paths} as {found}"
        register_plugin(registry_module.get_registry(), plugin, entry_point, distribution)
        found = [identify(path) for path in paths]
        assert all(format is layout for format in found), f"with {entry_point}'s plugin, {paths} are {found}"
        found = [identify(path) for path in not_matching]
        assert found == [None] * len(not_matching), f"{not_matching} are taken for {found}"
    finally:
        registry_module._registry = saved


def check_trainer_and_fabric_agree(
    trainer_class: type,
    fabric_class: type,
    own_names: Mapping[str, str] | None = None,
    extra_keywords: str | None = None,
) -> None:
    """Assert that a package's Trainer and Fabric strategies take the same options, each by name.

    Every parameter but ``**extra_keywords`` (keywords that are no option of the strategy's: FSDP hands them on to
    ``fully_shard``, XLA refuses them by name) must be named with a default, so ``inspect.signature``, LightningCLI
    and ``lightning-strategies info`` see all of them. The two signatures must match in order, kind, default and
    annotation, but for the parameters each entry point names after its own Lightning base class: ``own_names`` maps
    the Trainer's name to Fabric's (by default ``precision_plugin`` to ``precision``); those must stand at the same
    place. Where jsonargparse (LightningCLI's parser) is installed, it must read every parameter of both.
    """
    import inspect

    renamed = {"precision_plugin": "precision"} if own_names is None else dict(own_names)
    signatures = {cls: inspect.signature(cls) for cls in (trainer_class, fabric_class)}
    for cls, signature in signatures.items():
        parameters = [parameter for name, parameter in signature.parameters.items() if name != extra_keywords]
        # *args and **kwargs have no default either: only ``**extra_keywords`` may stand without one.
        unnamed = [str(parameter) for parameter in parameters if parameter.default is parameter.empty]
        assert not unnamed, f"{cls.__qualname__} takes {unnamed}: name each option, with its default."
        _check_jsonargparse_reads(cls, [parameter.name for parameter in parameters])
    trainer = list(signatures[trainer_class].parameters.values())
    fabric = list(signatures[fabric_class].parameters.values())
    assert [renamed.get(parameter.name, parameter.name) for parameter in trainer] == [p.name for p in fabric], (
        f"{trainer_class.__qualname__} and {fabric_class.__qualname__} name or order their parameters differently."
    )
    for ours, theirs in zip(trainer, fabric, strict=True):
        if ours.name in renamed:
            continue
        assert (ours.kind, ours.default, ours.annotation) == (theirs.kind, theirs.default, theirs.annotation), (
            f"{ours.name}: {trainer_class.__qualname__} takes {ours}, {fabric_class.__qualname__} {theirs}."
        )


def check_lightning_cli_builds(
    strategy_class: type, values: Mapping[str, Any], lightning_class: type | None = None
) -> tuple[Any, Any]:
    """Build ``strategy_class`` as LightningCLI does, from command-line strings and from YAML, with ``values``: what
    a command line or a YAML file gives, as YAML holds it (numbers, strings, lists, ``{"class_path": ...,
    "init_args": {...}}``). Returns the two strategies built, for the caller to check what each parameter became.

    The constructor's annotations must be real types (``typing.get_type_hints`` resolves them), since they are what
    jsonargparse, LightningCLI's parser, reads a value into. With ``lightning_class``, the Lightning class the
    strategy stands in for: every parameter it names is one of ours, none is ``Any`` where Lightning's has a type,
    and Lightning's parser reads every value it has a parameter for, so ``values`` are values Lightning's class
    accepts too. Needs jsonargparse (``pip install "jsonargparse[signatures]"``).
    """
    import inspect
    import typing

    hints = typing.get_type_hints(strategy_class.__init__)  # type: ignore[misc]  # the class's own constructor
    if lightning_class is not None:
        theirs = {
            name: parameter
            for name, parameter in inspect.signature(lightning_class).parameters.items()
            if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        }
        ours = inspect.signature(strategy_class).parameters
        missing = [name for name in theirs if name not in ours]
        assert not missing, f"{strategy_class.__qualname__} does not take {missing} of {lightning_class.__module__}."
        untyped = [
            name
            for name, parameter in theirs.items()
            if hints.get(name, Any) is Any and parameter.annotation not in (Any, parameter.empty)
        ]
        assert not untyped, f"{strategy_class.__qualname__} annotates {untyped} as Any; Lightning's class has types."
        _parse_strategy(lightning_class, {name: value for name, value in values.items() if name in theirs}, "cli")
    built = tuple(_build_strategy(strategy_class, values, source) for source in ("cli", "yaml"))
    return built[0], built[1]


def _strategy_parser(strategy_class: type) -> Any:
    """A parser of ``--strategy`` typed as the Trainer and Fabric type theirs: a name or a Strategy of the class's
    entry point (LightningCLI's ``--trainer.strategy``)."""
    from jsonargparse import ArgumentParser

    base = next(kind for kind in strategy_class.__mro__ if kind.__name__ == "Strategy")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=str | base)
    return parser


def _parse_strategy(strategy_class: type, values: Mapping[str, Any], source: str) -> tuple[Any, Any]:
    import yaml

    parser = _strategy_parser(strategy_class)
    path = f"{strategy_class.__module__}.{strategy_class.__qualname__}"
    try:
        if source == "cli":
            given = [f"--strategy.{name}={_as_text(value)}" for name, value in values.items()]
            return parser, parser.parse_args([f"--strategy={path}", *given])
        config = {"strategy": {"class_path": path, "init_args": dict(values)}}
        return parser, parser.parse_string(yaml.safe_dump(config))
    except Exception as error:  # jsonargparse's errors name the parameter; say which class and source refused
        raise AssertionError(
            f"LightningCLI's parser refuses {dict(values)} for {path} from {source}: {error}"
        ) from None


def _build_strategy(strategy_class: type, values: Mapping[str, Any], source: str) -> Any:
    parser, namespace = _parse_strategy(strategy_class, values, source)
    # jsonargparse 4.49 renamed instantiate_classes to instantiate.
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    strategy = instantiate(namespace).strategy
    assert type(strategy) is strategy_class, f"LightningCLI built {type(strategy).__qualname__} from {source}"
    return strategy


def _as_text(value: Any) -> str:
    """A value as a command line gives it: strings bare (jsonargparse keeps quotes a string is given with)."""
    return value if isinstance(value, str) else json.dumps(value)


def _check_jsonargparse_reads(cls: type, names: list[str]) -> None:
    try:
        from jsonargparse import ArgumentParser
    except ImportError:  # only LightningCLI users install it; package test environments need not
        return
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "strategy")
    read = {action.dest.removeprefix("strategy.") for action in parser._actions}
    missing = [name for name in names if name not in read]
    assert not missing, f"jsonargparse (LightningCLI's parser) does not read {missing} of {cls.__qualname__}."


def check_internal(internal: str, kind: str, used_in: str) -> None:
    """Fail, naming ``internal`` and ``used_in``, where a private name of another library that a package relies on
    is gone or no longer of its ``kind``: run on the pinned versions, a raised pin fails here instead of in a run.

    ``internal`` is ``"module:Dotted.path"``; ``kind`` is ``"callable"``, ``"value"`` (it exists) or ``"instance
    attribute"`` (the owner's source assigns ``self.<name>``: such attributes exist only on built objects);
    ``used_in`` is the file of the package that uses it. Example::

        check_internal("deepspeed.runtime.engine:DeepSpeedEngine._config", "instance attribute", "checkpoint.py")
    """
    module_name, _, path = internal.partition(":")
    *parents, name = path.split(".")
    owner = importlib.import_module(module_name)
    for parent in parents:
        owner = getattr(owner, parent)
    where = f"{internal} ({kind}), which {used_in} relies on (docs/internals.md)"
    if kind == "instance attribute":
        assigned = re.search(rf"self\.{re.escape(name)}\s*(:|=(?!=))", inspect.getsource(owner))
        assert assigned, f"{where}: {parents[-1]} no longer assigns it"
        return
    assert hasattr(owner, name), f"{where}: gone"
    if kind == "callable":
        assert callable(getattr(owner, name)), f"{where}: no longer callable"
