"""The offloaded share of Gemini's static placement, on ColossalAI's own ChunkManager (CPU, gloo).

What cannot exist here is a GPU: the accelerator's current device is named ``cuda:0`` (a name only; nothing is
allocated there) so that the chunks kept on the GPU and those offloaded can be told apart.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from lightning_strategies_colossalai.static_placement import share_by_chunk_policy, static_placement_by_chunk

CHUNK_ELEMENTS = 1000


@pytest.fixture
def ten_parameters_in_four_chunks(gloo_world_of_one):
    """Ten parameters of 300 elements in chunks of 1000: three to a chunk, the last chunk holding one."""
    from colossalai.zero.gemini.chunk import ChunkManager

    manager = ChunkManager({1: {"chunk_size": CHUNK_ELEMENTS}}, init_device=torch.device("cpu"))
    parameters = [torch.nn.Parameter(torch.randn(300)) for _ in range(10)]
    for parameter in parameters:
        manager.register_tensor(parameter, "fp16_param", 1, dist.group.WORLD)
    manager.close_all_groups()
    return manager, parameters


@pytest.fixture
def named_gpu(monkeypatch):
    import colossalai.accelerator

    accelerator = colossalai.accelerator.get_accelerator()
    monkeypatch.setattr(accelerator, "get_current_device", lambda: torch.device("cuda", 0))


def offloaded_chunks(policy_class, manager, parameters, fraction):
    policy = policy_class(manager, shard_param_frac=1.0, offload_optim_frac=fraction, offload_param_frac=0.0)
    devices = {}
    policy.setup_grads_device(parameters, devices)
    return [manager.get_chunk(p) for p in parameters if devices[p].type == "cpu"]


@pytest.mark.parametrize(("fraction", "chunks"), [(0.0, 0), (0.25, 1), (0.5, 2), (0.6, 3), (1.0, 4)])
def test_the_offloaded_share_is_a_share_of_distinct_chunks(ten_parameters_in_four_chunks, named_gpu, fraction, chunks):
    manager, parameters = ten_parameters_in_four_chunks
    offloaded = offloaded_chunks(share_by_chunk_policy(), manager, parameters, fraction)
    assert len(set(offloaded)) == chunks
    # The leading chunks in the model's order, so every rank picks the same ones.
    in_order = list(dict.fromkeys(manager.get_chunk(p) for p in parameters))
    assert set(offloaded) == set(in_order[:chunks])


def test_colossalai_0_5_offloads_every_chunk_for_half(ten_parameters_in_four_chunks, named_gpu):
    """Why the policy exists: upstream counts each chunk once per parameter it holds when sizing the share."""
    from colossalai.zero.gemini.placement_policy import StaticPlacementPolicy

    manager, parameters = ten_parameters_in_four_chunks
    assert len(set(offloaded_chunks(StaticPlacementPolicy, manager, parameters, 0.5))) == 4


def test_the_policy_is_gemini_static_only_while_gemini_is_built():
    from colossalai.zero.gemini.placement_policy import PlacementPolicyFactory, StaticPlacementPolicy

    with static_placement_by_chunk():
        assert PlacementPolicyFactory.create("static").__name__ == "ShareByChunkPlacementPolicy"
    assert PlacementPolicyFactory.create("static") is StaticPlacementPolicy


def test_upstreams_policy_is_back_after_a_failed_build():
    from colossalai.zero.gemini.placement_policy import PlacementPolicyFactory, StaticPlacementPolicy

    with pytest.raises(RuntimeError, match="GeminiDDP failed"), static_placement_by_chunk():
        raise RuntimeError("GeminiDDP failed")
    assert PlacementPolicyFactory.create("static") is StaticPlacementPolicy


def test_only_the_offloaded_chunks_get_a_pinned_host_copy(ten_parameters_in_four_chunks, named_gpu):
    """Page-locking needs CUDA, which cannot exist here: ``pin`` stands in for it and records what it was asked."""
    manager, parameters = ten_parameters_in_four_chunks
    asked = []

    def pin(elements, dtype):
        asked.append((elements, dtype))
        return torch.empty(elements, dtype=dtype)

    offloaded = set(offloaded_chunks(share_by_chunk_policy(True, pin), manager, parameters, 0.5))
    chunks = list(dict.fromkeys(manager.get_chunk(p) for p in parameters))
    assert [chunk.pin_memory for chunk in chunks] == [chunk in offloaded for chunk in chunks] == [1, 1, 0, 0]
    assert asked == [(chunk.shard_size, chunk.dtype) for chunk in chunks[:2]]
    assert all(chunk.cpu_shard.numel() == chunk.shard_size for chunk in offloaded)


def test_nothing_is_pinned_unless_asked(ten_parameters_in_four_chunks, named_gpu):
    manager, parameters = ten_parameters_in_four_chunks
    offloaded_chunks(share_by_chunk_policy(), manager, parameters, 0.5)
    assert not any(manager.get_chunk(p).pin_memory for p in parameters)


def test_a_refused_pin_says_how_to_keep_the_chunks_pageable(ten_parameters_in_four_chunks, named_gpu):
    from lightning_strategies.pinned import PinningError

    manager, parameters = ten_parameters_in_four_chunks

    def refuse(elements, dtype):
        raise PinningError("CUDA could not page-lock 0.00 GiB of host memory.")

    with pytest.raises(PinningError, match="Pass pin_memory=False"):
        offloaded_chunks(share_by_chunk_policy(True, refuse), manager, parameters, 0.5)
