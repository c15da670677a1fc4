"""The GPT-style decoder every run trains, written here so that all runs train exactly the same model.

Pre-norm blocks (LayerNorm, one fused q/k/v Linear, causal scaled_dot_product_attention, output
projection; LayerNorm, GELU MLP 4x wide), learned position embeddings, a final LayerNorm and an
untied output head (untied so that every backend shards the embedding and the head as two
ordinary parameters; tying them is a special case some backends handle differently).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional
from torch.utils.checkpoint import checkpoint

from tools.benchmark.sizes import VOCABULARY, Size


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.projection = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.expand = nn.Linear(width, 4 * width)
        self.contract = nn.Linear(4 * width, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape
        qkv = self.qkv(self.attention_norm(hidden))
        # (batch, length, 3, heads, head_width) -> three tensors of (batch, heads, length, head_width)
        query, key, value = qkv.view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        hidden = hidden + self.projection(attended.transpose(1, 2).reshape(batch, length, width))
        return hidden + self.contract(functional.gelu(self.expand(self.mlp_norm(hidden))))


class GPT(nn.Module):
    """Takes tokens of shape (batch, length + 1) and returns the next-token cross-entropy loss."""

    def __init__(self, size: Size, length: int, checkpoint_blocks: bool = False) -> None:
        super().__init__()
        # Activation checkpointing: each block keeps only its input and is run again in backward, the
        # trade of compute for memory that lets the largest models train (issue 13).
        self.checkpoint_blocks = checkpoint_blocks
        self.token_embedding = nn.Embedding(VOCABULARY, size.width)
        self.position_embedding = nn.Embedding(length, size.width)
        self.blocks = nn.ModuleList(Block(size.width, size.heads) for _ in range(size.layers))
        self.final_norm = nn.LayerNorm(size.width)
        self.head = nn.Linear(size.width, VOCABULARY, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2's initialisation; also run after parameters created on the meta device are allocated."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        hidden = self.token_embedding(inputs) + self.position_embedding(positions)
        for block in self.blocks:
            if self.checkpoint_blocks and self.training:
                hidden = checkpoint(block, hidden, use_reentrant=False)
            else:
                hidden = block(hidden)
        logits = self.head(self.final_norm(hidden))
        return functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def matmul_parameter_count(size: Size) -> int:
    """Parameters that take part in a matrix multiplication per token: the blocks' weights and the head.

    Embedding lookups, biases and norms are left out (they cost no multiply-adds worth counting).
    """
    return size.layers * 12 * size.width * size.width + VOCABULARY * size.width


def training_flops_per_token(size: Size, length: int) -> int:
    """Model FLOPs of one training token: 6 N (forward 2N, backward 4N) over the matmul parameters,
    plus attention's score and weighted-sum products, 12 x layers x width x length (forward and
    backward, not halved for the causal mask), as in the PaLM paper's MFU definition."""
    return 6 * matmul_parameter_count(size) + 12 * size.layers * size.width * length
