"""Every measurement the harness knows, by id, and the presets that group them.

An id says how the model is trained and with what:
  trainer:NAME    ``Trainer(strategy="NAME")``: the strategy of this project's package registering NAME
  lightning:NAME  Lightning 2.6's own strategy class, built directly (our packages took over its names)
  hand:NAME       the backend driven without Lightning, configured as the matching trainer: run

A run id may end in ``@VARIANT``: the same run with one of ``VARIANTS`` applied (an environment
setting tested against the plain run, e.g. ``trainer:colossalai_cuda@expandable_segments``).
"""

from __future__ import annotations

import dataclasses
import importlib.util


@dataclasses.dataclass(frozen=True)
class Run:
    id: str
    description: str
    precision: str  # Lightning's flag, or what the by-hand loop does in those terms
    optimizer: str  # one of the names optimizers.build knows
    requires: tuple[str, ...]  # importable modules without which the run is skipped
    partner: str | None = None  # the by-hand run with the same backend and configuration
    accelerators: tuple[str, ...] = ("cuda",)

    @property
    def kind(self) -> str:
        return self.id.split(":", 1)[0]

    @property
    def name(self) -> str:
        return self.id.split(":", 1)[1].split("@", 1)[0]

    @property
    def variant(self) -> str:
        return self.id.partition("@")[2]

    @property
    def base(self) -> str:
        """The id without its variant."""
        return self.id.partition("@")[0]

    @property
    def environment(self) -> dict[str, str]:
        return VARIANTS[self.variant].environment if self.variant else {}

    def missing(self) -> list[str]:
        return [module for module in self.requires if importlib.util.find_spec(module) is None]


LIGHTNING = "lightning"
OUR_FSDP = "lightning_strategies_fsdp"
OUR_DEEPSPEED = "lightning_strategies_deepspeed"
OUR_COLOSSALAI = "lightning_strategies_colossalai"

_RUNS = [
    # Plain PyTorch: the floor every strategy is compared with on one device.
    Run("hand:torch", "PyTorch, bf16 autocast, fused AdamW (DDP when devices > 1)", "bf16-mixed", "adamw_fused",
        ("torch",), accelerators=("cuda", "cpu")),
    # FSDP2
    Run("hand:fsdp", "fully_shard on each block and the root, MixedPrecisionPolicy(bf16, reduce fp32)", "bf16-mixed",
        "adamw_fused", ("torch",), accelerators=("cuda", "cpu")),
    Run("hand:fsdp_cpu_offload", "as hand:fsdp, with CPUOffloadPolicy", "bf16-mixed", "adamw_fused", ("torch",)),
    Run("trainer:fsdp", "Trainer(strategy='fsdp'): lightning-strategies-fsdp (FSDP2)", "bf16-mixed", "adamw_fused",
        (LIGHTNING, OUR_FSDP), "hand:fsdp", ("cuda", "cpu")),
    Run("trainer:fsdp_cpu_offload", "Trainer(strategy='fsdp_cpu_offload'): FSDP2 with CPU offload", "bf16-mixed",
        "adamw_fused", (LIGHTNING, OUR_FSDP), "hand:fsdp_cpu_offload"),
    Run("lightning:fsdp", "lightning.pytorch.strategies.FSDPStrategy (FSDP1), blocks wrapped, bf16", "bf16-mixed",
        "adamw_fused", (LIGHTNING,), "hand:fsdp"),
    # DeepSpeed
    Run("hand:deepspeed_stage_2", "deepspeed.initialize, ZeRO-2, bf16, FusedAdam", "bf16-mixed", "deepspeed_fused_adam",
        ("deepspeed",)),
    Run("hand:deepspeed_stage_2_offload", "deepspeed.initialize, ZeRO-2 + optimizer offload, DeepSpeedCPUAdam",
        "bf16-mixed", "deepspeed_cpu_adam", ("deepspeed",)),
    Run("hand:deepspeed_stage_3", "deepspeed.initialize, ZeRO-3, bf16, FusedAdam", "bf16-mixed", "deepspeed_fused_adam",
        ("deepspeed",)),
    Run("hand:deepspeed_stage_3_offload",
        "deepspeed.initialize, ZeRO-3 + parameter/optimizer offload, DeepSpeedCPUAdam", "bf16-mixed",
        "deepspeed_cpu_adam", ("deepspeed",)),
    Run("trainer:deepspeed_stage_2", "Trainer(strategy='deepspeed_stage_2'): lightning-strategies-deepspeed",
        "bf16-mixed", "deepspeed_fused_adam", (LIGHTNING, OUR_DEEPSPEED, "deepspeed"), "hand:deepspeed_stage_2"),
    Run("trainer:deepspeed_stage_2_offload", "Trainer(strategy='deepspeed_stage_2_offload')", "bf16-mixed",
        "deepspeed_cpu_adam", (LIGHTNING, OUR_DEEPSPEED, "deepspeed"), "hand:deepspeed_stage_2_offload"),
    Run("trainer:deepspeed_stage_3", "Trainer(strategy='deepspeed_stage_3')", "bf16-mixed", "deepspeed_fused_adam",
        (LIGHTNING, OUR_DEEPSPEED, "deepspeed"), "hand:deepspeed_stage_3"),
    Run("trainer:deepspeed_stage_3_offload", "Trainer(strategy='deepspeed_stage_3_offload')", "bf16-mixed",
        "deepspeed_cpu_adam", (LIGHTNING, OUR_DEEPSPEED, "deepspeed"), "hand:deepspeed_stage_3_offload"),
    Run("lightning:deepspeed_stage_2", "lightning.pytorch.strategies.DeepSpeedStrategy(stage=2)", "bf16-mixed",
        "deepspeed_fused_adam", (LIGHTNING, "deepspeed"), "hand:deepspeed_stage_2"),
    Run("lightning:deepspeed_stage_3_offload",
        "lightning.pytorch.strategies.DeepSpeedStrategy(stage=3, offload_optimizer=True, offload_parameters=True)",
        "bf16-mixed", "deepspeed_cpu_adam", (LIGHTNING, "deepspeed"), "hand:deepspeed_stage_3_offload"),
    # ColossalAI Gemini. Placement "auto" runs in fp16: the colossalai package refuses auto with bf16
    # (NaN losses seen on an H200), so the by-hand partner uses fp16 as well.
    Run("hand:gemini_cuda", "GeminiPlugin via Booster, placement static, nothing offloaded, bf16, HybridAdam",
        "bf16-mixed", "hybrid_adam", ("colossalai",)),
    Run("hand:gemini_cpu", "GeminiPlugin via Booster, placement static, everything offloaded, bf16, HybridAdam",
        "bf16-mixed", "hybrid_adam", ("colossalai",)),
    Run("hand:gemini_auto", "GeminiPlugin via Booster, placement auto, fp16, HybridAdam", "16-mixed", "hybrid_adam",
        ("colossalai",)),
    Run("trainer:colossalai_cuda", "Trainer(strategy='colossalai_cuda'): lightning-strategies-colossalai-gemini",
        "bf16-mixed", "hybrid_adam", (LIGHTNING, OUR_COLOSSALAI, "colossalai"), "hand:gemini_cuda"),
    Run("trainer:colossalai_cpu", "Trainer(strategy='colossalai_cpu')", "bf16-mixed", "hybrid_adam",
        (LIGHTNING, OUR_COLOSSALAI, "colossalai"), "hand:gemini_cpu"),
    Run("trainer:colossalai_auto", "Trainer(strategy='colossalai_auto'), fp16 (bf16 is refused for 'auto')",
        "16-mixed", "hybrid_adam", (LIGHTNING, OUR_COLOSSALAI, "colossalai"), "hand:gemini_auto"),
]  # fmt: skip
RUNS: dict[str, Run] = {run.id: run for run in _RUNS}


@dataclasses.dataclass(frozen=True)
class Variant:
    description: str
    environment: dict[str, str]  # set in the run's processes before anything is imported
    runs: tuple[str, ...] = ()  # the run ids it changes (the by-hand loop reads it); empty: any run


# Settings tested against the plain run to find what makes a run's speed vary from one process to
# the next (the colossalai runs, issue #16). They change the environment, or how a by-hand run configures its
# backend, never a strategy.
VARIANTS: dict[str, Variant] = {
    "expandable_segments": Variant(
        "PyTorch's caching allocator grows segments in place instead of caching fixed blocks (no fragmentation)",
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    ),
    "unpinned": Variant(
        "by hand, GeminiPlugin without pinned chunk copies or asynchronous reduction (the colossalai strategy's "
        "default for placements other than cpu; ColossalAI's own default pins)",
        {},
        ("hand:gemini_cuda", "hand:gemini_cpu", "hand:gemini_auto"),
    ),
    "gc_frozen": Variant(
        "gc.collect() then gc.freeze() at the end of warm-up: collections in the timed steps skip set-up's objects",
        {"BENCHMARK_GC_FREEZE": "1"},
    ),
}

PRESETS: dict[str, list[str]] = {
    # The reference comparison of the issue: one GPU, GPT 1.3B.
    "issue": [
        "hand:torch",
        "hand:fsdp", "trainer:fsdp", "lightning:fsdp",
        "hand:deepspeed_stage_2", "trainer:deepspeed_stage_2", "lightning:deepspeed_stage_2",
        "hand:gemini_cuda", "trainer:colossalai_cuda",
    ],
    # Everything the catalogue has.
    "all": list(RUNS),
    # Two processes: what scales across GPUs (offloading variants left out; they are for one GPU's limits).
    "scaling": [
        "hand:torch", "hand:fsdp", "trainer:fsdp", "lightning:fsdp",
        "hand:deepspeed_stage_2", "trainer:deepspeed_stage_2", "lightning:deepspeed_stage_2",
        "hand:deepspeed_stage_3", "trainer:deepspeed_stage_3",
        "hand:gemini_cuda", "trainer:colossalai_cuda",
    ],
    # The drop-in comparison of issue #16 item 4, one GPU: each strategy by hand, through the Trainer,
    # and Lightning's built-in where one exists; run by tools/benchmark/dropin.sh with repeats.
    "dropin": [
        "hand:fsdp", "trainer:fsdp", "lightning:fsdp",
        "hand:deepspeed_stage_2", "trainer:deepspeed_stage_2", "lightning:deepspeed_stage_2",
        "hand:gemini_cuda", "trainer:colossalai_cuda",
    ],
    # What could make the colossalai runs' speed spread: the allocator setting against the plain runs
    # (15 runs at 5 repeats fit one call; the collector's share is recorded in every run, and
    # trainer:colossalai_cuda@gc_frozen tests it where that share is large).
    "colossalai_variants": [
        "hand:gemini_cuda", "trainer:colossalai_cuda", "trainer:colossalai_cuda@expandable_segments",
    ],
    # What the CPU test exercises (tiny model, gloo).
    "cpu": ["hand:torch", "hand:fsdp", "trainer:fsdp"],
}  # fmt: skip


def resolve(run_ids: list[str]) -> list[Run]:
    unknown = [run_id for run_id in run_ids if run_id.partition("@")[0] not in RUNS]
    if unknown:
        raise SystemExit(f"Unknown run id(s) {', '.join(unknown)}; known: {', '.join(RUNS)}.")
    variants = [run_id for run_id in run_ids if run_id.partition("@")[2] not in ("", *VARIANTS)]
    if variants:
        raise SystemExit(f"Unknown variant in {', '.join(variants)}; known: {', '.join(VARIANTS)}.")
    resolved = []
    for run_id in run_ids:
        base, _, variant = run_id.partition("@")
        # A variant that only some runs read would otherwise measure the plain run under its name.
        if variant and VARIANTS[variant].runs and base not in VARIANTS[variant].runs:
            raise SystemExit(
                f"{run_id}: the variant changes only {', '.join(VARIANTS[variant].runs)}; apply it to one of those."
            )
        run = RUNS[base]
        if variant:
            run = dataclasses.replace(run, id=run_id, description=f"{run.description}; {VARIANTS[variant].description}")
        resolved.append(run)
    return resolved


def is_gemini(run: Run) -> bool:
    """ColossalAI Gemini runs, by hand or through the Trainer: repeated more often (their speed spreads)."""
    return run.name.startswith(("gemini", "colossalai"))
