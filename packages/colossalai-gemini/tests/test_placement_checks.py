"""Where Gemini kept chunks, and what that means for CPUAdam and placement "cpu", checked at setup.

Gemini chunks live in CUDA memory, so stand-ins with the attributes the checks read (keep_gathered,
utilized_size, paired_chunk, device_type) take their place here; the GPU tier checks the real ones.
"""

from __future__ import annotations

import types

import pytest

from lightning_strategies.errors import CapabilityError
from lightning_strategies_colossalai.chunk_placement import chunks_with_gpu_master_weights, kept_gathered_parameters
from lightning_strategies_colossalai.precision import GeminiPrecision
from lightning_strategies_colossalai.strategy import ColossalAIStrategy


def chunk(master_device, keep_gathered=False, size=10):
    master = types.SimpleNamespace(device_type=master_device)
    return types.SimpleNamespace(keep_gathered=keep_gathered, utilized_size=size, paired_chunk=master)


def gemini_optimizer(chunks, optimizer_class):
    # GeminiOptimizer keeps a set; the checks only iterate it.
    return types.SimpleNamespace(chunk16_set=list(chunks), optim=optimizer_class.__new__(optimizer_class))


def strategy(precision="16-mixed", **kwargs):
    strategy = ColossalAIStrategy(**kwargs)
    strategy.precision_plugin = GeminiPrecision(precision)
    return strategy


def trainer(clip=None):
    return types.SimpleNamespace(gradient_clip_val=clip)


def test_chunk_counts():
    from colossalai.nn.optimizer import HybridAdam

    optimizer = gemini_optimizer([chunk("cuda", True, 7), chunk("cpu"), chunk("cuda")], HybridAdam)
    assert kept_gathered_parameters(optimizer) == 7
    assert chunks_with_gpu_master_weights(optimizer) == 2


@pytest.mark.parametrize(
    "placement", [{"placement_policy": "cpu"}, {"placement_policy": "static", "offload_optim_frac": 0.5}]
)
def test_an_offloading_placement_that_keeps_chunks_on_the_gpu_says_so(placement):
    from colossalai.nn.optimizer import HybridAdam

    optimizer = gemini_optimizer([chunk("cuda", keep_gathered=True, size=528)], HybridAdam)
    name = placement["placement_policy"]
    with pytest.warns(UserWarning, match=rf"placement '{name}' offloads nothing for 528 parameters.*min_chunk_size"):
        strategy(**placement)._check_placement(trainer(), optimizer)


@pytest.mark.parametrize(("precision", "clip"), [("16-mixed", None), ("bf16-mixed", 1.0)])
def test_cpu_adam_with_gpu_master_weights_and_a_scale_is_refused(precision, clip):
    from colossalai.nn.optimizer import CPUAdam

    optimizer = gemini_optimizer([chunk("cuda"), chunk("cpu")], CPUAdam)
    with pytest.raises(CapabilityError, match=r"CPUAdam with 1 chunk\(s\) with master weights on the GPU.*HybridAdam"):
        strategy(precision, placement_policy="cuda")._check_placement(trainer(clip), optimizer)


def test_cpu_adam_is_refused_where_auto_placement_may_move_master_weights_to_the_gpu():
    from colossalai.nn.optimizer import CPUAdam

    optimizer = gemini_optimizer([chunk("cpu")], CPUAdam)
    with pytest.raises(CapabilityError, match=r"gpu_margin_mem_ratio > 0"):
        strategy(placement_policy="auto", gpu_margin_mem_ratio=0.5)._check_placement(trainer(), optimizer)


def test_what_cpu_adam_can_step_is_accepted():
    from colossalai.nn.optimizer import CPUAdam, HybridAdam

    # Every master weight on CPU: its CPU kernel applies the scale.
    strategy(placement_policy="cpu")._check_placement(trainer(0.5), gemini_optimizer([chunk("cpu")], CPUAdam))
    # bf16 without clipping passes no scale, so GPU-held master weights are fine.
    strategy("bf16-mixed", placement_policy="cuda")._check_placement(
        trainer(), gemini_optimizer([chunk("cuda")], CPUAdam)
    )
    # HybridAdam updates GPU-held chunks with its fused CUDA kernel, which takes the scale.
    strategy(placement_policy="cuda")._check_placement(trainer(0.5), gemini_optimizer([chunk("cuda")], HybridAdam))


@pytest.mark.parametrize("margin", [0.0, 0.8])
def test_auto_placement_without_a_gpu_margin_says_it_updates_on_the_host(margin, monkeypatch):
    from colossalai.nn.optimizer import HybridAdam

    from lightning_strategies_colossalai import refusals

    said: list[str] = []
    monkeypatch.setattr(refusals, "rank_zero_info", said.append)
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    optimizer = gemini_optimizer([chunk("cpu")], HybridAdam)
    strategy(placement_policy="auto", gpu_margin_mem_ratio=margin)._check_placement(trainer(), optimizer)
    assert said == ([refusals.AUTO_WITHOUT_MARGIN] if margin == 0.0 else [])
    assert "gpu_margin_mem_ratio=0.8" in refusals.AUTO_WITHOUT_MARGIN


@pytest.mark.parametrize("huge_pages", [None, "1"])
def test_auto_placement_says_how_to_set_up_faster_unless_huge_pages_are_on(huge_pages, monkeypatch):
    """Its set-up copies every shard into new host memory; huge pages halved that at 1B on one H200."""
    from colossalai.nn.optimizer import HybridAdam

    from lightning_strategies_colossalai import refusals

    said: list[str] = []
    monkeypatch.setattr(refusals, "rank_zero_info", said.append)
    if huge_pages is None:
        monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    else:
        monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", huge_pages)
    optimizer = gemini_optimizer([chunk("cpu")], HybridAdam)
    strategy(placement_policy="auto", gpu_margin_mem_ratio=0.8)._check_placement(trainer(), optimizer)
    assert said == ([refusals.AUTO_WITHOUT_HUGE_PAGES] if huge_pages is None else [])
    assert "THP_MEM_ALLOC_ENABLE=1" in refusals.AUTO_WITHOUT_HUGE_PAGES
    strategy(placement_policy="cuda")._check_placement(trainer(), gemini_optimizer([chunk("cuda")], HybridAdam))
    assert len(said) == (1 if huge_pages is None else 0)  # the others copy into pinned memory, or nothing
