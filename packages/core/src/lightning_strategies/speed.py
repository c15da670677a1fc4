"""``SpeedMonitor``: tokens per second, TFLOP/s per GPU and MFU in the user's own logger, for any strategy.

MFU (model FLOPs utilisation) is the model's training FLOPs per second over the device's peak. Lightning's
``ThroughputMonitor`` takes the peak from a table that gives the H100 and H200 their bf16 figure with sparsity
(2.0e15), which halves the MFU it logs; dense matrix multiplications, what training runs, peak at half that.
This table holds the dense 16-bit figures of NVIDIA's data sheets; a device it does not know, or a CPU, gets MFU
only from a ``peak_flops`` the user passes.

Training FLOPs per token follow the usual count (Kaplan et al.; PaLM's appendix for attention): 6 per parameter
that multiplies (embedding lookups do not; a head tied to the embedding does), plus 12 x layers x width x sequence
length for attention's two matrix products, where the model is a ``transformers`` model whose config names its
layers and width. Parameters are counted whole however a strategy shards them (ZeRO-3's ``ds_numel``, FSDP2's
DTensor).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import nn
from typing_extensions import override

__all__ = ["DENSE_16BIT_PEAKS", "SpeedMonitor", "dense_peak_flops", "flops_per_token", "whole_numel"]

# Dense bf16/fp16 tensor-core peaks in FLOP/s, by a part of the name torch reports; the first match wins, so a
# variant comes before the name it contains (data sheets: H100 SXM 989.4 TFLOP/s, PCIe 756, NVL 835; H200 and
# GH200 as H100 SXM; A100 312; L40S 362; L40 181; L4 121).
DENSE_16BIT_PEAKS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
)


def dense_peak_flops(device: torch.device) -> float | None:
    """The dense 16-bit peak of ``device`` in FLOP/s, or None for a CPU or a GPU the table does not know."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for part, peak in DENSE_16BIT_PEAKS if part in name), None)


def whole_numel(parameter: nn.Parameter) -> int:
    """Elements of ``parameter`` before any sharding: ZeRO-3 keeps the whole count in ``ds_numel``; an FSDP2
    DTensor's ``numel`` is already the whole tensor's."""
    return int(getattr(parameter, "ds_numel", parameter.numel()))


def _embedding_parameters(module: nn.Module) -> Iterator[nn.Parameter]:
    for submodule in module.modules():
        if isinstance(submodule, nn.Embedding):
            yield from submodule.parameters(recurse=False)


def _tied_heads(module: nn.Module) -> Iterator[nn.Parameter]:
    """Output heads sharing their weight with an embedding (``transformers``' tied embeddings): a matrix product
    per token that no separate parameter stands for."""
    for submodule in module.modules():
        get_output = getattr(submodule, "get_output_embeddings", None)
        get_input = getattr(submodule, "get_input_embeddings", None)
        if callable(get_output) and callable(get_input):
            head, embedding = get_output(), get_input()
            if head is not None and embedding is not None and head.weight is embedding.weight:
                yield head.weight


def _attention_shape(module: nn.Module) -> tuple[int, int] | None:
    """(layers, width) from the first ``transformers`` config found in ``module``."""
    for submodule in module.modules():
        config = getattr(submodule, "config", None)
        layers, width = (getattr(config, name, None) for name in ("num_hidden_layers", "hidden_size"))
        if isinstance(layers, int) and isinstance(width, int):
            return layers, width
    return None


def flops_per_token(module: nn.Module, sequence_length: int) -> int:
    """Training FLOPs per token of ``module`` (forward and backward) at ``sequence_length``, as the module
    docstring counts them."""
    embeddings = {id(parameter) for parameter in _embedding_parameters(module)}
    multiplying = sum(whole_numel(p) for p in module.parameters() if id(p) not in embeddings)
    multiplying += sum(whole_numel(p) for p in _tied_heads(module))
    shape = _attention_shape(module)
    attention = 12 * shape[0] * shape[1] * sequence_length if shape else 0
    return 6 * multiplying + attention


def token_tensor(batch: Any) -> torch.Tensor | None:
    """The tensor of token ids in a batch: ``input_ids`` of a mapping, the first tensor of a sequence, or the batch
    itself."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        found = batch.get("input_ids")
        return found if isinstance(found, torch.Tensor) else None
    if isinstance(batch, (list, tuple)):
        return next((item for item in batch if isinstance(item, torch.Tensor)), None)
    return None


class SpeedMonitor(Callback):
    """Logs ``speed/tokens_per_second`` (all processes together), ``speed/tflops_per_gpu`` and ``speed/mfu`` as
    training runs, each over the last ``window`` batches, every ``log_every_n_steps`` of the Trainer.

    Args:
        peak_flops: The device's peak in FLOP/s to compute MFU against. Default: the dense 16-bit peak of the GPU
            (H100, H200, GH200, A100, L40S, L40, L4); elsewhere MFU is not logged.
        flops_per_token: Training FLOPs per token. Default: counted from the model on the first batch (see the
            module docstring); pass it for a model the count does not fit (mixture of experts, say).
        tokens_per_batch: A function of the batch giving its token count on this process. Default: the elements
            of the batch's token ids (``input_ids`` of a mapping, the first tensor of a sequence).
        window: Batches the rates are averaged over.
        prog_bar: Also show the numbers in the progress bar.
    """

    def __init__(
        self,
        peak_flops: float | None = None,
        flops_per_token: int | None = None,
        tokens_per_batch: Callable[[Any], int] | None = None,
        window: int = 20,
        prog_bar: bool = False,
    ) -> None:
        if peak_flops is not None and peak_flops <= 0:
            raise ValueError(f"SpeedMonitor(peak_flops={peak_flops!r}) must be positive: the device's FLOP/s.")
        if window < 2:
            raise ValueError(f"SpeedMonitor(window={window!r}) must be at least 2: a rate needs two batch ends.")
        self.peak_flops = peak_flops
        self.flops_per_token = flops_per_token
        self.tokens_per_batch = tokens_per_batch
        self.prog_bar = prog_bar
        self._ends: collections.deque[tuple[float, int]] = collections.deque(maxlen=window)
        self._peak: float | None = None
        self._warned_tokens = False

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._ends.clear()
        self._peak = self.peak_flops or dense_peak_flops(trainer.strategy.root_device)
        if self._peak is None:
            rank_zero_warn(
                f"SpeedMonitor: no peak FLOP/s is known for {trainer.strategy.root_device}, so MFU is not logged; "
                "pass SpeedMonitor(peak_flops=...) with the device's dense 16-bit peak."
            )

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        ids = token_tensor(batch)  # looked up once: both the count and, on the first batch, the length read it
        tokens = self._count_tokens(batch, ids)
        if tokens is None:
            return
        if self.flops_per_token is None:
            self.flops_per_token = flops_per_token(pl_module, self._sequence_length(ids))
            if not self.flops_per_token:
                rank_zero_warn(
                    "SpeedMonitor counted no parameters in the model (a strategy that keeps them out of the module), "
                    "so only tokens/s is logged; pass SpeedMonitor(flops_per_token=...) for TFLOP/s and MFU."
                )
        self._ends.append((time.perf_counter(), tokens))
        every = trainer.log_every_n_steps  # type: ignore[attr-defined]  # the Trainer's logger connector sets it
        if len(self._ends) < 2 or (batch_idx + 1) % every:
            return
        # Rates between the first and the last batch end of the window: the first batch's own tokens came before.
        seconds = self._ends[-1][0] - self._ends[0][0]
        local_tokens_per_second = sum(count for _, count in list(self._ends)[1:]) / seconds
        flops_per_second = local_tokens_per_second * self.flops_per_token
        metrics = {"speed/tokens_per_second": local_tokens_per_second * trainer.world_size}
        if flops_per_second:
            metrics["speed/tflops_per_gpu"] = flops_per_second / 1e12
        if flops_per_second and self._peak:
            metrics["speed/mfu"] = flops_per_second / self._peak
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=self.prog_bar, batch_size=1)

    def _count_tokens(self, batch: Any, ids: torch.Tensor | None) -> int | None:
        if self.tokens_per_batch is not None:
            return int(self.tokens_per_batch(batch))
        if ids is None:
            if not self._warned_tokens:
                self._warned_tokens = True
                rank_zero_warn(
                    f"SpeedMonitor found no token ids in a batch of type {type(batch).__name__}; pass "
                    "SpeedMonitor(tokens_per_batch=lambda batch: ...) returning the batch's token count."
                )
            return None
        return ids.numel()

    @staticmethod
    def _sequence_length(ids: torch.Tensor | None) -> int:
        return int(ids.shape[-1]) if ids is not None and ids.dim() else 1
