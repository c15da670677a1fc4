"""A GPT decoder built from torch modules only (no downloads), sized by name, for the benchmarks."""

from __future__ import annotations

import torch

SIZES = {  # name: (layers, width, heads)
    "125m": (12, 768, 12),
    "350m": (24, 1024, 16),
    "1.3b": (24, 2048, 16),
    "2.7b": (32, 2560, 32),
    "6.7b": (32, 4096, 32),
    "13b": (40, 5120, 40),
    "20b": (44, 6144, 48),
}
VOCAB = 50304


class GPT(torch.nn.Module):
    def __init__(self, size: str, length: int = 1024) -> None:
        super().__init__()
        layers, width, heads = SIZES[size]
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.position = torch.nn.Embedding(length, width)
        layer = torch.nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, VOCAB, bias=False)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(length), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        hidden = self.embed(inputs) + self.position(positions)
        mask = self.mask[: inputs.shape[1], : inputs.shape[1]].to(hidden.dtype)
        hidden = self.norm(self.blocks(hidden, mask=mask, is_causal=True))
        logits = self.head(hidden).float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def parameter_count(size: str) -> int:
    layers, width, _ = SIZES[size]
    return layers * 12 * width * width + 2 * VOCAB * width
