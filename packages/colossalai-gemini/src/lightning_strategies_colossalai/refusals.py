"""What ColossalAIStrategy refuses, and why: combinations ColossalAI 0.5's Gemini cannot train correctly.

Each refusal names the problem and what to use instead, and runs as soon as its inputs exist (the
accelerator before processes launch, the precision when the plugin is chosen, the optimizers and
clipping at setup, where the chunks landed once Gemini placed them), so nothing trains on weights that a
silent fallback would spoil. Kept apart from strategy.py so the reasons read in one place; colossalai is
imported only inside the checks that need its classes.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_strategies import CapabilityError
from lightning_strategies_colossalai.chunk_placement import chunks_with_gpu_master_weights, kept_gathered_parameters
from lightning_strategies_colossalai.options import GeminiSettings

# Placement "auto" moves parameter chunks by measured use, but GeminiOptimizer moves the fp32 master weights and
# Adam's moments to the GPU only within gpu_margin_mem_ratio of the memory left after the first step; at Lightning's
# default of 0 every update runs on the CPU. Measured on one H200 (docs/strategies.md, three runs each).
AUTO_WITHOUT_MARGIN = (
    "ColossalAIStrategy: placement 'auto' with gpu_margin_mem_ratio=0.0 (the default, as Lightning's) keeps every "
    "optimizer chunk (fp32 master weights, Adam's moments) on the host and updates it there. Pass "
    "gpu_margin_mem_ratio=0.8 to let Gemini move as many as fit into the GPU memory left after the first step: a "
    "Llama 1B on one H200 trained at 37,629 tokens/s with it, against 1,552 without (colossalai_cuda: 36,926)."
)
# Placement "auto" builds each chunk's shards on the GPU, then copies them into new, unpinned host memory at set-up
# (16-bit and fp32 alike; its first step moves them where they run), page by page. Torch allocates in 2 MiB pages only
# where THP_MEM_ALLOC_ENABLE=1 was set before its first allocation, too early for a strategy to set it in the process
# it runs in. Measured on one H200 host with transparent huge pages on "madvise", two runs each (docs/strategies.md).
AUTO_WITHOUT_HUGE_PAGES = (
    "ColossalAIStrategy: placement 'auto' copied every chunk's shards into new host memory at set-up. Start the run "
    "with THP_MEM_ALLOC_ENABLE=1 in its environment, so that torch allocates that memory in huge pages (where the "
    "kernel's transparent huge pages are 'madvise' or 'always'): a Llama 1B on one H200 then reached its first step "
    "in 3.8 to 4.0 s instead of 7.4 to 8.4 s."
)
ALLOWED_OPTIMIZERS = ("colossalai.nn.optimizer.HybridAdam", "colossalai.nn.optimizer.CPUAdam")

# HybridAdam/CPUAdam update bf16 gradients held on CPU with a plain torch fallback that ignores the
# combined scale GeminiOptimizer passes in, and that scale is how Gemini applies max_norm.
CPU_BF16_CLIP_REASON = (
    "with bf16, ColossalAI 0.5's HybridAdam/CPUAdam update CPU-held gradients through a torch fallback that "
    "ignores the clipping scale, so gradient_clip_val would silently not apply to offloaded chunks. Use "
    "precision='16-mixed', or strategy='colossalai_cuda' (optimizer on the GPU), or no gradient clipping."
)
# CPUAdam updates master weights held on the GPU with a plain torch Adam that takes no gradient scale, and
# asserts when GeminiOptimizer passes one (the fp16 loss scale, or a clipping factor).
CPU_ADAM_ON_GPU_REASON = (
    "ColossalAI 0.5's CPUAdam updates master weights held on the GPU with a plain torch Adam that cannot divide "
    "the gradients by GeminiOptimizer's scale (the fp16 loss scale and the gradient clipping factor); it stops "
    "with 'div_scale should remain default'. Use colossalai.nn.optimizer.HybridAdam, which updates chunks on "
    "GPU and CPU and applies the scale on both; or keep CPUAdam with placement_policy='cpu' and a model of at "
    "least min_chunk_size parameters (or a smaller min_chunk_size), so every chunk is offloaded."
)


def check_accelerator(accelerator: Any, placement: str) -> None:
    """Refuse anything but CUDA, before processes are launched or colossalai is imported."""
    if accelerator is None or isinstance(accelerator, CUDAAccelerator):
        return
    raise CapabilityError(
        f"ColossalAIStrategy needs a CUDA GPU, but the accelerator is {type(accelerator).__name__}. Gemini runs its "
        f"kernels in CUDA memory; placement_policy={placement!r} only chooses where chunks and optimizer states "
        "are kept between uses"
        + (" (with 'cpu', as in colossalai_cpu, CPU memory is the offload target, and training still "
           "runs on the GPU)" if placement == "cpu" else "")
        + ". Use Trainer(accelerator='cuda', ...) on a machine with an NVIDIA GPU; for CPU-only training "
        "pick another strategy (for example deepspeed or fsdp from lightning-strategies)."
    )  # fmt: skip


def check_adapters(module: Any) -> None:
    """PEFT adapters (LoRA) freeze the model they adapt, and Gemini keeps frozen parameters whole on every GPU."""
    from lightning_strategies.hugging_face import lora_layers

    if lora_layers(module):
        raise CapabilityError(
            "ColossalAIStrategy cannot train a PEFT LoRA model: ColossalAI 0.5's GeminiPlugin does not support LoRA "
            "(its support_lora() is False) and keeps every frozen parameter, the whole base model here, unsharded "
            "on each GPU. Train the adapter with strategy='fsdp' or 'deepspeed_stage_3', which shard the frozen "
            "model, or fine-tune the whole model with colossalai."
        )


def check_optimizers(optimizers: list[Any]) -> None:
    """Gemini steps exactly one HybridAdam or CPUAdam (GeminiOptimizer refuses any other type)."""
    from colossalai.nn.optimizer import CPUAdam, HybridAdam

    if len(optimizers) != 1:
        raise ValueError(
            f"ColossalAIStrategy supports exactly one optimizer, configure_optimizers returned {len(optimizers)}."
        )
    optimizer = optimizers[0]
    if type(optimizer) not in (HybridAdam, CPUAdam):
        raise TypeError(
            f"ColossalAIStrategy needs one of {', '.join(ALLOWED_OPTIMIZERS)} (their chunk-aware kernels "
            f"update fp32 master weights on GPU and CPU); configure_optimizers returned "
            f"{type(optimizer).__module__}.{type(optimizer).__qualname__}. For example: "
            "`from colossalai.nn.optimizer import HybridAdam; "
            "return HybridAdam(self.parameters(), lr=1e-3)`."
        )


def check_clipping(settings: GeminiSettings, gemini_precision: str, trainer: Any) -> None:
    clip = trainer.gradient_clip_val
    if not clip:
        return
    if trainer.gradient_clip_algorithm not in (None, "norm"):
        raise CapabilityError(
            "ColossalAIStrategy clips gradients by norm only (GeminiOptimizer has no clip by value); "
            "use Trainer(gradient_clip_algorithm='norm')."
        )
    if gemini_precision == "bf16" and settings.offloads:
        raise CapabilityError(
            f"gradient_clip_val={clip} with placement {settings.placement_policy!r}, which offloads optimizer "
            "states: " + CPU_BF16_CLIP_REASON
        )


def refuse_weight_averaging(trainer: Any) -> None:
    """Lightning's StochasticWeightAveraging refuses its sharded strategies (DeepSpeed, FSDP) by class; Gemini
    shards as they do, and Lightning has no class of it to check, so the strategy refuses for itself."""
    if any(isinstance(callback, StochasticWeightAveraging) for callback in trainer.callbacks):
        raise MisconfigurationException(  # Lightning's words for its sharded strategies first
            "SWA does not currently support sharded models. StochasticWeightAveraging keeps a full copy of the "
            "model, which ColossalAI's Gemini holds in shards (chunks spread over ranks and devices). Remove the "
            "callback, or train with Trainer(strategy='ddp') to average weights."
        )


def check_placement(settings: GeminiSettings, gemini_precision: str, trainer: Any, gemini_optimizer: Any) -> None:
    """Say where Gemini kept chunks on the GPU against the placement, and what keeps placement auto's optimizer
    on the host; refuse what CPUAdam cannot step."""
    if settings.placement_policy == "auto" and os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
        rank_zero_info(AUTO_WITHOUT_HUGE_PAGES)
    kept = kept_gathered_parameters(gemini_optimizer)
    if kept and settings.offloads and settings.placement_policy != "auto":
        rank_zero_warn(
            f"ColossalAIStrategy: placement {settings.placement_policy!r} offloads nothing for {kept} parameters: "
            "Gemini keeps a model "
            f"smaller than min_chunk_size={settings.min_chunk_size} parameters (or any chunk when "
            "enable_distributed_storage=False) gathered on the GPU with its optimizer states. Pass a smaller "
            "min_chunk_size (or a chunk_size with enable_distributed_storage=True) to offload it."
        )
    from colossalai.nn.optimizer import CPUAdam

    if type(gemini_optimizer.optim) is not CPUAdam:
        if settings.placement_policy == "auto" and not settings.gpu_margin_mem_ratio:
            rank_zero_info(AUTO_WITHOUT_MARGIN)
        return
    scaled = gemini_precision == "fp16" or bool(trainer.gradient_clip_val)
    on_gpu = chunks_with_gpu_master_weights(gemini_optimizer)
    # With "auto" and a GPU margin, GeminiOptimizer moves master weights to the GPU at the first step.
    may_move = settings.placement_policy == "auto" and settings.gpu_margin_mem_ratio > 0
    if scaled and (on_gpu or may_move):
        where = "placement 'auto' with gpu_margin_mem_ratio > 0"
        if on_gpu:
            where = f"{on_gpu} chunk(s) with master weights on the GPU"
        scale = "fp16 loss scaling" if gemini_precision == "fp16" else "gradient clipping"
        raise CapabilityError(f"ColossalAIStrategy: CPUAdam with {where} and {scale}: {CPU_ADAM_ON_GPU_REASON}")
