"""A resumed ColossalAI CPU Adam steps exactly as an uninterrupted one once its C++ kernel is replayed.

ColossalAI's CPU Adam kernel steps CPU tensors, but ColossalAI builds it only where CUDA is available
(its loader finds "no usable kernel" without), so this is a test of the gpu tier. Gemini's CPU-held
chunks step through this kernel; on an H200 their resume was inexact (test_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from lightning_strategies_colossalai.checkpoint_state import replay_cpu_adam_kernel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="ColossalAI builds its CPU Adam kernel only with CUDA"),
]
CPUAdam = pytest.importorskip("colossalai.nn.optimizer").CPUAdam


def parameters() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(64, generator=generator)) for _ in range(3)]


def step(optimizer: torch.optim.Optimizer, weights: list[torch.nn.Parameter], number: int) -> None:
    for index, weight in enumerate(weights):
        weight.grad = torch.full_like(weight, 0.01 * (number + 1)) * (index + 1) + weight.detach() * 0.1
    optimizer.step()


def resumed_weights(replay: bool, saved_after: int = 3, steps: int = 5) -> list[torch.Tensor]:
    weights = parameters()
    optimizer = CPUAdam(weights, lr=0.1)
    for number in range(saved_after):
        step(optimizer, weights, number)
    state = optimizer.state_dict()
    resumed = CPUAdam(weights, lr=0.1)  # a new kernel, as after a restart
    resumed.load_state_dict(state)
    if replay:
        replay_cpu_adam_kernel(resumed)
    for number in range(saved_after, steps):
        step(resumed, weights, number)
    return [weight.detach().clone() for weight in weights]


def uninterrupted_weights(steps: int = 5) -> list[torch.Tensor]:
    weights = parameters()
    optimizer = CPUAdam(weights, lr=0.1)
    for number in range(steps):
        step(optimizer, weights, number)
    return [weight.detach().clone() for weight in weights]


def test_a_replayed_kernel_resumes_bit_for_bit() -> None:
    expected = uninterrupted_weights()
    assert all(torch.equal(got, want) for got, want in zip(resumed_weights(replay=True), expected, strict=True))


def test_a_fresh_kernel_does_not() -> None:
    """The cause itself: without the replay the first parameter's first resumed step differs."""
    got, expected = resumed_weights(replay=False), uninterrupted_weights()
    assert not torch.equal(got[0], expected[0])
