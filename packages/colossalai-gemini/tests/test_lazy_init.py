"""Modules built in model_sharded_context stay lazy until materialised (real ColossalAI, CPU)."""

from __future__ import annotations

import torch

from lightning_strategies_colossalai.strategy import ColossalAIStrategy


def test_configure_model_context_creates_lazy_parameters_that_materialise():
    from colossalai.lazy import LazyInitContext
    from colossalai.lazy.lazy_init import LazyTensor

    strategy = ColossalAIStrategy(placement_policy="cuda", parallel_devices=[torch.device("cpu")])
    torch.manual_seed(0)
    with strategy.tensor_init_context(), strategy.model_sharded_context():
        module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    assert all(isinstance(parameter, LazyTensor) for parameter in module.parameters())

    LazyInitContext.materialize(module)
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    for lazy_parameter, eager_parameter in zip(module.parameters(), eager.parameters(), strict=True):
        assert not isinstance(lazy_parameter, LazyTensor)
        torch.testing.assert_close(lazy_parameter.detach(), eager_parameter.detach())
