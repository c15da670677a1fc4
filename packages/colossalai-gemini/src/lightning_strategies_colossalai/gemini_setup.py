"""Wrapping the LightningModule and its optimizer in GeminiDDP and GeminiOptimizer, once per Trainer run.

Placement "auto" learns where chunks go from a traced training step, so what the run is decides the
plugin: evaluation alone keeps every chunk on the GPU, and a fit's sanity check, which comes before the
first training step, is skipped. A later fit, validate or test of the same model reuses its chunks
rather than wrapping the wrapped module again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_strategies_colossalai.options import GeminiSettings, gemini_plugin_arguments
from lightning_strategies_colossalai.static_placement import static_placement_by_chunk


def run_plugin_arguments(settings: GeminiSettings, precision: str, world_size: int, trainer: Any) -> dict[str, Any]:
    """The GeminiPlugin keyword arguments for this run of ``trainer``."""
    fitting = trainer.state.fn == TrainerFn.FITTING
    arguments = gemini_plugin_arguments(
        settings,
        precision,
        world_size,
        accumulate_grad_batches=trainer.accumulate_grad_batches if fitting else 1,
        gradient_clip_val=trainer.gradient_clip_val if fitting else None,
    )
    if not fitting and arguments["placement_policy"] == "auto":
        # "auto" learns its layout from a training step; evaluation alone keeps chunks on the GPU.
        arguments.update(placement_policy="static", offload_optim_frac=0.0, offload_param_frac=0.0)
    return arguments


def skip_sanity_check_before_tracing(settings: GeminiSettings, trainer: Any, traced: bool) -> None:
    """Placement "auto" cannot evaluate before a training step has traced memory (``traced``: one has)."""
    if settings.placement_policy == "auto" and not traced and trainer.num_sanity_val_steps:
        rank_zero_warn(
            "ColossalAIStrategy: placement 'auto' needs one training step to trace memory before it can "
            "evaluate, so the sanity-check validation is skipped."
        )
        trainer.num_sanity_val_steps = 0


def configure_gemini(
    gemini_plugin: Any,
    gemini_model: Any,
    lightning_module: Any,
    optimizer: Any,
    plugin_arguments: Callable[[], dict[str, Any]],
    pin_offloaded: bool,
) -> tuple[Any, Any, Any]:
    """(plugin, GeminiDDP model, GeminiOptimizer or None) for this run; a new plugin for a new module;
    ``pin_offloaded``: static placement pins the offloaded chunks' host copies."""
    if gemini_model is None or gemini_model.module is not lightning_module:
        from colossalai.booster.plugin import GeminiPlugin

        gemini_plugin = GeminiPlugin(**plugin_arguments())
        module: Any = lightning_module
    else:
        module = gemini_model  # a later fit/validate/test of the same model reuses its chunks
    with static_placement_by_chunk(pin_offloaded):
        model, gemini_optimizer, *_ = gemini_plugin.configure(module, optimizer)
    return gemini_plugin, model, gemini_optimizer
