"""Gemini's memory statistics of a run: what the old ZeRO API reported, read from ColossalAI 0.5 and sent to the
Trainer's loggers (the memory model `lightning-strategies plan` predicts with is memory.py).

Model data is what the chunks hold (fp16/bf16 parameters, fp32 master weights, gradients).
Non-model data (activations, workspace) is measured by Gemini's memory tracer during the
warm-up iteration of the "auto" placement, the only policy that traces. Optimizer bytes are
the fp32 master weights and the Adam moments, split by the device that holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

PREFIX = "colossalai/"


def _device_kind(device: torch.device | str) -> str:
    kind = torch.device(device).type
    return "cpu" if kind == "cpu" else "cuda"


def model_data_bytes(gemini_model: Any) -> dict[str, int]:
    """Bytes of chunk memory on each device, from the chunk manager's own bookkeeping."""
    total = gemini_model.chunk_manager.total_mem
    return {"cuda": int(total.get("cuda", 0)), "cpu": int(total.get("cpu", 0))}


def non_model_data_peak_bytes(gemini_model: Any) -> int | None:
    """Peak CUDA non-model data seen by the memory tracer; None where nothing was traced."""
    manager = gemini_model.gemini_manager
    if not manager.need_warmup or manager.is_warmup():
        return None
    samples = manager.memstats().non_model_data_list("cuda")
    return int(max(samples)) if samples else None


def optimizer_bytes(gemini_optimizer: Any) -> dict[str, int]:
    """Bytes held for the optimizer: fp32 master chunks plus every state tensor, by device."""
    usage = {"cuda": 0, "cpu": 0}
    for chunk16 in gemini_optimizer.chunk16_set:
        master = chunk16.paired_chunk
        if master is not None and master is not chunk16:
            usage[_device_kind(master.device_type)] += int(master.payload_mem)
    for state in gemini_optimizer.optim.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                usage[_device_kind(value.device)] += value.numel() * value.element_size()
    return usage


def memory_statistics(gemini_model: Any, gemini_optimizer: Any | None = None) -> dict[str, float]:
    """The statistics as flat metric names (bytes), ready for ``logger.log_metrics``."""
    stats: dict[str, float] = {}
    for device, value in model_data_bytes(gemini_model).items():
        stats[f"{PREFIX}model_data_{device}_bytes"] = value
    peak = non_model_data_peak_bytes(gemini_model)
    if peak is not None:
        stats[f"{PREFIX}non_model_data_cuda_peak_bytes"] = peak
    if gemini_optimizer is not None:
        for device, value in optimizer_bytes(gemini_optimizer).items():
            stats[f"{PREFIX}optimizer_{device}_bytes"] = value
    return stats


def log_memory_statistics(trainer: Any, is_global_zero: bool, statistics: Callable[[], dict[str, float]]) -> None:
    """Send rank 0's statistics to the Trainer's loggers at the Trainer's logging cadence (``log_every_n_steps``),
    as Lightning logs its own metrics; they are computed only on the steps that log them."""
    if trainer is None or not trainer.loggers or not is_global_zero:
        return
    if trainer.global_step % max(1, trainer.log_every_n_steps) != 0:
        return
    stats = statistics()
    for logger in trainer.loggers:
        logger.log_metrics(stats, step=trainer.global_step)
