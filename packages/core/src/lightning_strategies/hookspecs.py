"""The hooks a strategy plugin implements: the whole contract between core and a plugin.

Implementations may accept fewer arguments than a spec names (core passes only those they
ask for), so a spec can gain arguments without breaking published plugins.

Core calls each plugin's implementation of a hook on its own, in pluggy's order: the plugin loaded
last first, unless ``tryfirst`` or ``trylast`` moves it. An implementation that raises, or returns
something its hook does not, is skipped for that call: the command that asked (`list`, `doctor`,
`plan`) names the plugin with its error, the error is logged once as a warning, and every other
plugin's answer is used. A plugin whose ``register_strategies`` raises registers no names; its other
hooks are still asked. Since no implementation runs inside another's, a wrapper (``wrapper=True`` or
``hookwrapper=True``) has nothing to wrap and makes the plugin invalid.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from lightning_strategies.checkpoints.formats import CheckpointFormat
    from lightning_strategies.entries import PluginRegistrar
    from lightning_strategies.planning import Candidate, Machine, Workload

PROJECT_NAME = "lightning_strategies"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_strategies(registry: PluginRegistrar) -> None:
    """Register the strategy names a plugin provides.

    Called once per process, the first time any name is listed or resolved. Call
    ``registry.register(name, target, description=..., init_params={...}, **metadata)`` once per
    name. ``target`` is a ``"module:Class"`` string (imported only when the name is resolved)
    or a class. Keep the module holding this hook free of heavy imports: listing and
    validating names must not import a backend.

    Args:
        registry: the registrar for the plugin being loaded; it records which distribution
            provides each name, so clashes can name both distributions.
    """


@hookspec
def environment_checks() -> list[tuple[str, bool, str]]:  # type: ignore[empty-body]
    """Report what this machine needs for the plugin's strategies, for `lightning-strategies doctor`.

    Return ``(what, ok, detail)`` tuples, e.g. ``("libaio (NVMe offload)", False, "apt-get install
    libaio-dev")``. Keep it fast and side-effect free. Core reports only what every strategy shares
    (Python, torch, CUDA devices, host memory, Lightning) and checks the backend versions declared in
    the distribution's requirements; tools a backend needs (a compiler, ninja, nvcc for JIT-built
    kernels, libaio) are the plugin's to check here.
    """


@hookspec
def checkpoint_formats() -> list[CheckpointFormat]:  # type: ignore[empty-body]
    """Describe the checkpoint layouts the plugin's strategies write, so that any strategy refusing one can
    say what it is, who reads it and how to convert it (``lightning_strategies.checkpoints.identify``).

    Return :class:`~lightning_strategies.checkpoints.CheckpointFormat` objects, each with a unique ``key``
    and a ``matches(path)`` predicate that tells the layout from the file or folder alone: no unpickling,
    and False for any other layout (a single ``torch.save`` file is core's own format, tried after every
    plugin's). ``to_full_weights`` may name ``{path}``. Called only when a checkpoint is identified; import
    ``lightning_strategies.checkpoints`` inside the hook, since it imports torch. ``lightning-strategies convert``
    reads and writes a layout only through its format's ``read_weights``, ``to_full_checkpoint`` and
    ``from_full_checkpoint`` (``--to`` takes its ``convert_name``). ``derived`` holds glob patterns of the top-level
    entries a strategy writes inside such a folder from the saved files, which leave the folder's one-file form
    current.
    """


@hookspec
def lightning_module_imported(module_name: str, module: ModuleType) -> None:
    """Adjust a Lightning module right after Lightning imported it, before anyone uses it.

    Called for the modules core watches (``lightning_strategies.watched_modules()``, of one kind with
    ``watched_modules("xla accelerator")``): the strategy registries, the connectors, and the XLA
    accelerator modules. For fixes that
    cannot wait until a strategy is built, such as Lightning's XLA accelerator reaching for the
    network when it counts devices. Keep it cheap, and import the plugin's heavy parts inside.

    Args:
        module_name: the module's full name, e.g. ``"lightning.fabric.accelerators.xla"``.
        module: the module object, fully executed.
    """


@hookspec
def memory_plan_candidates(workload: Workload, machine: Machine) -> list[Candidate]:  # type: ignore[empty-body]
    """Predict the memory of the plugin's strategy names for a workload, for `lightning-strategies plan`.

    Return one :class:`~lightning_strategies.planning.Candidate` per setting worth considering (a name,
    the constructor settings that make it fit, its predicted peaks), built from the package's
    :class:`~lightning_strategies.planning.Prediction` with ``lightning_strategies.planning.candidate_from(...)``
    so that ``fits`` is judged alike for every package. Our packages answer from ``memory.candidates``.
    Choose the settings that fit where the strategy has a dial (an offload fraction, a bucket size);
    ``planning.smallest_fitting_fraction`` finds the least offload that fits. Keep it arithmetic: no
    backend import, no device use. Candidates naming strategies the registry cannot resolve are dropped.

    Args:
        workload: the model (parameter count and GPT-style shape), tokens per step and device,
            precision, optimizer and whether activations are checkpointed.
        machine: GPUs in all (``gpus``) over ``nodes``, the memory of each, each node's host memory and NVMe space
            for offloading. Predict ``host_bytes`` for one node's ``machine.processes_per_node`` processes, with
            each process's set-up cost as the strategy builds the model (a whole copy, or none on the meta
            device or partitioned), and that node's share of what is offloaded. ``gpus`` 0 asks for training on
            the CPU: answer with ``gpu_bytes`` 0 (``planning.on_cpu``) where the strategy trains there, else
            nothing.
    """
