"""The precision plugin for Gemini, which does its own mixed precision, loss scaling and clipping.

GeminiDDP keeps fp16/bf16 parameters in chunks and casts floating inputs itself, and
GeminiOptimizer scales the loss (fp16), unscales, clips by norm and steps the fp32 master
weights. So this plugin adds no autocast and no GradScaler; it runs the closure, lets Lightning's
hooks see the gradients, and hands the step to GeminiOptimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_strategies_colossalai.options import PRECISIONS


class GeminiPrecision(Precision):
    """fp16 (dynamic loss scaling) or bf16 mixed precision as done by GeminiDDP/GeminiOptimizer."""

    def __init__(self, precision: str) -> None:
        if precision not in PRECISIONS:
            raise ValueError(
                f"ColossalAI Gemini supports precision '16-mixed' or 'bf16-mixed', got {precision!r}: "
                "GeminiDDP keeps half-precision parameters with fp32 master weights and has no fp32 mode. "
                "Pass precision='16-mixed' or precision='bf16-mixed' to the Trainer."
            )
        self.precision = precision  # type: ignore[assignment]

    @property
    def gemini_precision(self) -> str:
        """The name GeminiPlugin uses for this precision ("fp16" or "bf16")."""
        return PRECISIONS[self.precision]

    @override
    def optimizer_step(  # type: ignore[override]
        self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        closure_result = closure()
        self._after_closure(model, optimizer)
        if getattr(model, "automatic_optimization", False) and closure_result is None:
            raise MisconfigurationException(
                "Skipping backward by returning None from training_step is not supported by "
                "ColossalAI Gemini: "
                "every rank must take part in each step's gradient reduction."
            )
        # GeminiOptimizer.step unscales, checks overflow (fp16), clips and updates; it takes no closure.
        return optimizer.step(**kwargs)

    @override
    def clip_gradients(
        self,
        optimizer: Any,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        """Clipping by norm happens inside GeminiOptimizer.step (max_norm is set from the Trainer)."""
        if clip_val and gradient_clip_algorithm == GradClipAlgorithmType.VALUE:
            raise MisconfigurationException(
                "ColossalAI Gemini clips gradients by norm only (GeminiOptimizer has no clip by value). "
                "Use Trainer(gradient_clip_algorithm='norm')."
            )
