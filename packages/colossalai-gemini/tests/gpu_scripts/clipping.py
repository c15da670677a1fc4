"""Gradient clipping by norm with chunks on the GPU and with chunks offloaded to the CPU, on several GPUs.

Usage: python clipping.py OUT_FOLDER [DEVICES]   (run by tests/test_gpu.py; Lightning launches the other ranks;
DEVICES defaults to 2)
Rank 0 writes OUT_FOLDER/clipping.json: per placement the total gradient norm Gemini clipped each step, and
whether the fp32 master weights after clipping agree between the placements (and differ from no clipping).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).parent))
from several_gpus import SMALL_CHUNKS, full_weights
from tiny_gpt import TinyGPT

from lightning_strategies_colossalai.strategy import ColossalAIStrategy

CLIP = 0.05  # far below TinyGPT's gradient norm (about 1), so every step clips
# Adam divides out a constant gradient scale; a large eps makes its update follow the gradient's size, so
# clipping that skipped the offloaded chunks would show in the weights rather than hide in Adam's ratio.
EPS = 1.0


class LargeEpsGPT(TinyGPT):
    def configure_optimizers(self):
        from colossalai.nn.optimizer import HybridAdam

        return HybridAdam(self.parameters(), lr=1e-2, eps=EPS)


class GeminiNorms(Callback):
    """The total norm GeminiOptimizer computed for clipping, divided by the loss scale it ran with (the step's
    scale: the grad scaler updates before the next backward). get_grad_div_scale() would read it too, but
    asserts that the gradients are still scaled."""

    def __init__(self) -> None:
        self.norms: list[float | None] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        optimizer = trainer.strategy.gemini_optimizer
        norm = optimizer.get_grad_norm()
        # A step skipped for an fp16 overflow computes no norm and leaves the last one: clear it after reading.
        optimizer._current_grad_norm = None
        self.norms.append(None if norm is None else norm / optimizer.mix_precision_mixin.loss_scale)


def run(out: Path, placement: str, clip: float | None, devices: int) -> tuple[list[float | None], dict]:
    L.seed_everything(7)
    chunks = {"min_chunk_size": SMALL_CHUNKS} if placement == "cpu" else {}
    norms = GeminiNorms()
    trainer = L.Trainer(
        accelerator="cuda",
        devices=devices,
        precision="16-mixed",  # bf16 clipping with CPU chunks is refused (refusals.CPU_BF16_CLIP_REASON)
        max_steps=6,
        gradient_clip_val=clip,
        callbacks=[norms],
        logger=False,
        strategy=ColossalAIStrategy(placement_policy=placement, **chunks),
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        default_root_dir=out,
    )
    trainer.fit(LargeEpsGPT())
    return norms.norms, {key: value.float().cpu() for key, value in full_weights(trainer).items()}


def largest_difference(first: dict, second: dict) -> float:
    return max(float((first[key] - second[key]).abs().max()) for key in first)


def main() -> None:
    out = Path(sys.argv[1])
    devices = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    on_gpu_norms, on_gpu = run(out, "cuda", CLIP, devices)
    offloaded_norms, offloaded = run(out, "cpu", CLIP, devices)
    _, unclipped = run(out, "cpu", None, devices)
    if torch.distributed.get_rank() == 0:
        result = {
            "clip": CLIP,
            "world_size": torch.distributed.get_world_size(),
            "cuda": on_gpu_norms,
            "cpu": offloaded_norms,
            "placements_differ_by": largest_difference(on_gpu, offloaded),
            "clipping_changes_weights_by": largest_difference(offloaded, unclipped),
        }
        (out / "clipping.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
