"""The checkpoint additions: fp32 chunk transfers and the full fp16 loss-scaler state.

ColossalAI's DynamicGradScaler allocates its scale on the current CUDA device, so a stand-in with its
attributes (``scale`` tensor, ``_growth_step``, ``_hysteresis_step``) takes its place here.
"""

from __future__ import annotations

import types

import torch

from lightning_strategies_colossalai.checkpoint_state import (
    fp32_chunk_transfers,
    load_loss_scaler_state,
    loss_scaler_state,
)


def test_fp32_chunk_transfers_restore_the_training_dtype_even_on_error():
    model = types.SimpleNamespace(mixed_precision=torch.float16)
    with fp32_chunk_transfers(model):
        assert model.mixed_precision is torch.float32
    assert model.mixed_precision is torch.float16
    try:
        with fp32_chunk_transfers(model):
            raise KeyError("interrupted")
    except KeyError:
        pass
    assert model.mixed_precision is torch.float16


def optimizer_with_scaler(scale, growth_step, hysteresis_step):
    scaler = types.SimpleNamespace(
        scale=torch.tensor([scale]), _growth_step=growth_step, _hysteresis_step=hysteresis_step
    )
    return types.SimpleNamespace(mix_precision_mixin=types.SimpleNamespace(grad_scaler=scaler))


def test_loss_scaler_round_trip_keeps_scale_and_counters():
    saved = loss_scaler_state(optimizer_with_scaler(2.0**13, 17, 1))
    assert saved == {"scale": 2.0**13, "growth_step": 17, "hysteresis_step": 1}
    fresh = optimizer_with_scaler(2.0**16, 0, 0)
    scale_tensor = fresh.mix_precision_mixin.grad_scaler.scale
    load_loss_scaler_state(fresh, saved)
    assert loss_scaler_state(fresh) == saved
    assert fresh.mix_precision_mixin.grad_scaler.scale is scale_tensor  # updated in place, on its device


def test_bf16_and_old_checkpoints_have_no_loss_scaler():
    bf16 = types.SimpleNamespace(mix_precision_mixin=types.SimpleNamespace())
    assert loss_scaler_state(bf16) is None
    load_loss_scaler_state(bf16, {"scale": 1.0, "growth_step": 0, "hysteresis_step": 0})
    fresh = optimizer_with_scaler(2.0**16, 3, 0)
    load_loss_scaler_state(fresh, None)  # a checkpoint written before the scaler was saved
    assert loss_scaler_state(fresh) == {"scale": 2.0**16, "growth_step": 3, "hysteresis_step": 0}
