"""Registers the colossalai strategy names with lightning-strategies (imports nothing heavy)."""

from lightning_strategies import hookimpl

_TARGET = "lightning_strategies_colossalai.strategy:ColossalAIStrategy"
_CAPABILITIES = {
    # Gemini keeps chunks in CUDA memory and runs its kernels there; CPU memory is only an offload target.
    "accelerators": ("cuda",),
    # GeminiDDP trains in fp16 or bf16 with fp32 master weights; it has no fp32 mode.
    "precisions": ("16-mixed", "bf16-mixed"),
    # GeminiOptimizer accepts only ColossalAI's chunk-aware Adam optimizers.
    "optimizers": ("colossalai.nn.optimizer:HybridAdam", "colossalai.nn.optimizer:CPUAdam"),
    "gradient_accumulation": True,
}

_NAMES = {
    "colossalai": (
        "auto",
        "ColossalAI Gemini, placement 'auto': chunks move between GPU and CPU by measured use",
    ),
    "colossalai_cuda": (
        "cuda",
        "ColossalAI Gemini, placement 'cuda': sharded chunks and optimizer states on GPU",
    ),
    "colossalai_cpu": (
        "cpu",
        "ColossalAI Gemini, placement 'cpu': parameters and optimizer states offloaded to CPU",
    ),
    "colossalai_auto": ("auto", "ColossalAI Gemini, placement 'auto' (same as 'colossalai')"),
}


@hookimpl
def register_strategies(registry):
    for name, (placement, description) in _NAMES.items():
        registry.register(
            name,
            _TARGET,
            description=description,
            init_params={"placement_policy": placement},
            **_CAPABILITIES,
        )


@hookimpl
def environment_checks():
    # colossalai is installed beside this package with --no-deps, so core's check of the declared
    # requirements does not see it.
    from importlib import metadata

    from packaging.version import Version

    from lightning_strategies.backends import jit_build_checks
    from lightning_strategies_colossalai.backend import DISTRIBUTION, INSTALL_HINT, SUPPORTED

    # HybridAdam and CPUAdam JIT-build their C++ and CUDA kernels on first use.
    kernels = jit_build_checks("colossalai")
    what = f"{DISTRIBUTION}: colossalai"
    try:
        installed = metadata.version("colossalai")
    except metadata.PackageNotFoundError:
        return [(what, False, f"not installed: {INSTALL_HINT}"), *kernels]
    detail = f"{installed} (tested: {SUPPORTED})"
    if Version(installed) not in SUPPORTED:
        return [(what, False, f"{detail}; install a tested version: {INSTALL_HINT}"), *kernels]
    return [(what, True, detail), *kernels]


@hookimpl
def memory_plan_candidates(workload, machine):
    from lightning_strategies_colossalai.memory import candidates

    return candidates(workload, machine)


@hookimpl
def checkpoint_formats():
    from lightning_strategies_colossalai.checkpoint_layout import COLOSSALAI

    return [COLOSSALAI]


@hookimpl
def lightning_module_imported(module_name, module):
    from lightning_strategies_colossalai.lightning_names import export_from_lightning

    export_from_lightning(module_name, module)
