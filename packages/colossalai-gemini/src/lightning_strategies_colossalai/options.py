"""How the old ColossalAIStrategy parameters translate into ColossalAI 0.5 GeminiPlugin arguments.

Kept free of colossalai and torch imports so the translation is checked (and tested) before
anything heavy loads, and so a refusal happens before a GPU is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from lightning_strategies import check_choice, check_type, warn_obsolete_parameter

STRATEGY = "ColossalAIStrategy"
# As types, so the constructor's annotations tell LightningCLI (and type checkers) the values allowed.
Placement = Literal["cpu", "cuda", "auto", "static"]
StateDictType = Literal["full", "sharded"]
PLACEMENTS = get_args(Placement)
STATE_DICT_TYPES = get_args(StateDictType)
PRECISIONS = {"16-mixed": "fp16", "bf16-mixed": "bf16"}
# ColossalAI counts chunk sizes in parameters (elements) and takes search sizes in units of 2**20.
MEBI = 2**20

LOSS_SCALER_DEFAULTS = {
    "initial_scale": 2**16,
    "min_scale": 1,
    "growth_factor": 2,
    "backoff_factor": 0.5,
    "growth_interval": 1000,
    "hysteresis": 2,
    "max_scale": 2**32,
}


@dataclass(frozen=True)
class GeminiSettings:
    """The validated constructor parameters of ColossalAIStrategy (seed page 000)."""

    use_chunk: bool = True
    chunk_size: int | None = None
    enable_distributed_storage: bool = True
    placement_policy: str = "auto"
    force_outputs_fp32: bool = False
    gpu_margin_mem_ratio: float = 0.0
    chunk_search_range: int = 64 * MEBI
    chunk_search_n_grids: int = 4096
    min_chunk_size: int = 32 * MEBI
    initial_scale: float = 2**16
    min_scale: float = 1
    growth_factor: float = 2
    backoff_factor: float = 0.5
    growth_interval: int = 1000
    hysteresis: int = 2
    max_scale: float = 2**32
    state_dict_type: str = "full"
    offload_optim_frac: float | None = None
    offload_param_frac: float | None = None
    pin_memory: bool | None = None
    max_prefetch: int = 0

    def __post_init__(self) -> None:
        check_choice(STRATEGY, "placement_policy", self.placement_policy, PLACEMENTS)
        self._check_offload_fractions()
        check_choice(STRATEGY, "state_dict_type", self.state_dict_type, STATE_DICT_TYPES)
        for name in ("use_chunk", "enable_distributed_storage", "force_outputs_fp32"):
            check_type(STRATEGY, name, getattr(self, name), bool)
        if self.pin_memory is not None:
            check_type(STRATEGY, "pin_memory", self.pin_memory, bool)
        if self.chunk_size is not None:
            _check_positive_int("chunk_size", self.chunk_size)
        for name in ("chunk_search_n_grids", "growth_interval", "hysteresis"):
            _check_positive_int(name, getattr(self, name))
        for name in ("chunk_search_range", "min_chunk_size", "max_prefetch"):
            check_type(STRATEGY, name, getattr(self, name), int)
            if getattr(self, name) < 0:
                raise ValueError(f"{STRATEGY}({name}={getattr(self, name)!r}) must be zero or positive.")
        check_type(STRATEGY, "gpu_margin_mem_ratio", self.gpu_margin_mem_ratio, (int, float))
        if not 0.0 <= self.gpu_margin_mem_ratio <= 1.0:
            raise ValueError(
                f"{STRATEGY}(gpu_margin_mem_ratio={self.gpu_margin_mem_ratio!r}) must lie between 0 and 1: "
                "it is the share of free GPU memory the optimizer may use."
            )
        for name in ("initial_scale", "min_scale", "max_scale", "growth_factor"):
            check_type(STRATEGY, name, getattr(self, name), (int, float))
        if not 0.0 < self.backoff_factor < 1.0:
            raise ValueError(f"{STRATEGY}(backoff_factor={self.backoff_factor!r}) must lie strictly between 0 and 1.")
        if self.growth_factor <= 1:
            raise ValueError(f"{STRATEGY}(growth_factor={self.growth_factor!r}) must be greater than 1.")
        if not 0 < self.min_scale <= self.initial_scale <= self.max_scale:
            raise ValueError(
                f"{STRATEGY}: loss scales must satisfy 0 < min_scale <= initial_scale <= max_scale; got "
                f"min_scale={self.min_scale!r}, initial_scale={self.initial_scale!r}, "
                f"max_scale={self.max_scale!r}."
            )

    def _check_offload_fractions(self) -> None:
        given = {
            name: getattr(self, name)
            for name in ("offload_optim_frac", "offload_param_frac")
            if getattr(self, name) is not None
        }
        if given and self.placement_policy != "static":
            raise ValueError(
                f"{STRATEGY}({', '.join(f'{k}={v!r}' for k, v in given.items())}) sets an offload fraction, which "
                f"only placement_policy='static' reads; got placement_policy={self.placement_policy!r}. Pass "
                "placement_policy='static' ('cuda' is static with both fractions 0, 'cpu' with both 1)."
            )
        for name, value in given.items():
            check_type(STRATEGY, name, value, (int, float))
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{STRATEGY}({name}={value!r}) must lie between 0 and 1.")
        if self.offload_param_frac not in (None, 0, 1):
            # Gemini offloads parameter chunks only while those being evicted exceed the share kept on the GPU,
            # which the one or two chunks of the previous operation never do: a share between 0 and 1 offloads
            # about nothing.
            raise ValueError(
                f"{STRATEGY}(offload_param_frac={self.offload_param_frac!r}): ColossalAI 0.5 offloads parameter "
                "chunks all or none (a share in between stays on the GPU). Pass offload_param_frac=1.0 (with "
                "offload_optim_frac=1.0, as placement_policy='cpu' does) or 0.0."
            )
        if (self.offload_param_frac or 0.0) > 0.0 and (self.offload_optim_frac or 0.0) < 1.0:
            # GeminiPlugin only warns and then keeps every parameter chunk on the GPU.
            raise ValueError(
                f"{STRATEGY}(offload_param_frac={self.offload_param_frac!r}) offloads parameter chunks, which "
                "Gemini does only once every optimizer state is offloaded; got "
                f"offload_optim_frac={self.offload_optim_frac!r}. "
                "Pass offload_optim_frac=1.0, or offload_param_frac=0.0 to offload a share of the optimizer only."
            )
        if not self.enable_distributed_storage and (self.offload_param_frac or 0.0) > 0.0:
            raise ValueError(
                f"{STRATEGY}(offload_param_frac={self.offload_param_frac!r}) needs sharded chunks, and "
                "enable_distributed_storage=False keeps them whole. Enable distributed storage, or offload the "
                "optimizer only (offload_param_frac=0.0)."
            )

    @property
    def pinned(self) -> bool:
        """``pin_memory``, or by default only for placement "cpu", whose chunks live on the host anyway (the pinned
        buffers are those chunks; transfers from pinned memory are faster)."""
        return self.pin_memory if self.pin_memory is not None else self.placement_policy == "cpu"

    @property
    def pins_offloaded_chunks(self) -> bool:
        """By default static placement pins the host copies of the chunks it offloads, and only those: unpinned,
        backward copies their gradients to pageable memory synchronously (static_placement.py)."""
        return self.pin_memory is None and self.placement_policy == "static"

    @property
    def offloads(self) -> bool:
        """Whether any chunk's optimizer side may live in host memory (placement auto decides at run time)."""
        if self.placement_policy == "static":
            return bool(self.offload_optim_frac)
        return self.placement_policy != "cuda"

    def warn_obsolete(self) -> None:
        """Warn, once at construction, about parameters ColossalAI 0.5 no longer uses."""
        if not self.use_chunk:
            warn_obsolete_parameter(
                STRATEGY,
                "use_chunk",
                self.use_chunk,
                "ColossalAI 0.5's GeminiDDP always stores parameters in chunks; the chunk-free ZeRO path "
                "was removed upstream. Tune chunk_size or min_chunk_size instead.",
            )
        if self.gpu_margin_mem_ratio and self.placement_policy != "auto":
            warn_obsolete_parameter(
                STRATEGY,
                "gpu_margin_mem_ratio",
                self.gpu_margin_mem_ratio,
                f"it is only used by placement_policy='auto' (the memory tracer measures the GPU margin), "
                f"and this strategy uses placement_policy={self.placement_policy!r}.",
            )
        if self.chunk_size is not None:
            for name in ("chunk_search_range", "chunk_search_n_grids", "min_chunk_size"):
                default = GeminiSettings.__dataclass_fields__[name].default
                if getattr(self, name) != default:
                    warn_obsolete_parameter(
                        STRATEGY,
                        name,
                        getattr(self, name),
                        "chunk_size is given, so no chunk size is searched.",
                    )

    def warn_precision(self, precision: str) -> None:
        """Loss scaling exists for fp16 only; say so when bf16 is combined with custom scaler settings."""
        if PRECISIONS.get(precision) != "bf16":
            return
        for name, default in LOSS_SCALER_DEFAULTS.items():
            if getattr(self, name) != default:
                warn_obsolete_parameter(
                    STRATEGY,
                    name,
                    getattr(self, name),
                    "bf16 has the range of fp32, so GeminiOptimizer does not scale the loss in bf16-mixed.",
                )


def _check_positive_int(name: str, value: Any) -> None:
    check_type(STRATEGY, name, value, int)
    if value <= 0:
        raise ValueError(f"{STRATEGY}({name}={value!r}) must be a positive integer.")


def placement_arguments(settings: GeminiSettings) -> dict[str, Any]:
    """GeminiPlugin placement arguments for the old three placement policies.

    ColossalAI 0.5 replaced "cpu"/"cuda" by a "static" policy with fractions: "cuda" keeps every
    sharded chunk and the optimizer states on the GPU, "cpu" offloads all of them, and "static" takes
    the fractions given (unset ones are 0: nothing offloaded).
    """
    if settings.placement_policy == "auto":
        return {"placement_policy": "auto"}
    fixed = {"cpu": 1.0, "cuda": 0.0}.get(settings.placement_policy)
    return {
        "placement_policy": "static",
        # Without distributed storage every rank keeps whole chunks: ZeRO-2 style, nothing to shard.
        "shard_param_frac": 1.0 if settings.enable_distributed_storage else 0.0,
        "offload_optim_frac": float(fixed if fixed is not None else settings.offload_optim_frac or 0.0),
        "offload_param_frac": float(fixed if fixed is not None else settings.offload_param_frac or 0.0),
    }


def chunk_arguments(settings: GeminiSettings, world_size: int) -> dict[str, Any]:
    """Chunk size (fixed, or searched between the old bounds) in GeminiPlugin's terms."""
    if settings.chunk_size is not None:
        # GeminiDDP keys a fixed chunk configuration by the size of the data-parallel group.
        return {
            "chunk_config_dict": {
                world_size: {
                    "chunk_size": settings.chunk_size,
                    "keep_gathered": not settings.enable_distributed_storage,
                }
            }
        }
    return {
        "search_range_m": settings.chunk_search_range / MEBI,
        # The old API split the search range into n grids; the new one steps by an interval.
        "hidden_dim": max(1, settings.chunk_search_range // settings.chunk_search_n_grids),
        "min_chunk_size_m": settings.min_chunk_size / MEBI,
    }


def gemini_plugin_arguments(
    settings: GeminiSettings,
    precision: str,
    world_size: int,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
) -> dict[str, Any]:
    """Every GeminiPlugin keyword argument this strategy sets, for one run."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"{STRATEGY} trains in fp16 or bf16 mixed precision with fp32 master weights "
            f"(GeminiDDP has no fp32 mode); got precision={precision!r}. "
            "Pass precision='16-mixed' or precision='bf16-mixed' to the Trainer."
        )
    arguments: dict[str, Any] = {
        **placement_arguments(settings),
        **chunk_arguments(settings, world_size),
        "precision": PRECISIONS[precision],
        "strict_ddp_mode": not settings.enable_distributed_storage,
        "force_outputs_fp32": settings.force_outputs_fp32,
        "gpu_margin_mem_ratio": float(settings.gpu_margin_mem_ratio),
        "enable_gradient_accumulation": accumulate_grad_batches > 1,
        # GeminiPlugin's default (async reduce, which turns pinning on) keeps a pinned host copy of every chunk,
        # the ones on the GPU too: 6 to 12 bytes per parameter of host memory for the whole run, which keeps a
        # model that offloads a share of its optimizer from fitting the host. Unpinned, host memory holds only
        # what is offloaded. The cost: reduce-scatter no longer overlaps on its own stream on several GPUs
        # (not measured yet). pin_memory=True restores ColossalAI's default.
        "enable_async_reduce": settings.pinned,
        "pin_memory": settings.pinned,
        "max_prefetch": settings.max_prefetch,
        "max_norm": float(gradient_clip_val or 0.0),
        **{name: getattr(settings, name) for name in LOSS_SCALER_DEFAULTS},
    }
    return arguments
