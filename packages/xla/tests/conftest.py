"""PJRT's CPU device stands in for a TPU in the cpu tier; the tpu tier (``-m tpu``, a marker of core's pytest
plugin) runs on a TPU VM with PJRT_DEVICE=TPU."""

import os

import pytest

ON_TPU_TIER = os.environ.get("PJRT_DEVICE", "").upper() == "TPU"
if not ON_TPU_TIER:
    # Before torch_xla is imported anywhere: one PJRT CPU device (several hang in collectives on 2 cores).
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", "1")


@pytest.fixture(autouse=True)
def _activated():
    import lightning_strategies

    lightning_strategies.activate()


def small_trainer(tmp_path, **overrides):
    """A Trainer on single_xla that runs a few batches of each stage; ``overrides`` replace any setting."""
    from lightning.pytorch import Trainer

    from lightning_strategies_xla import XLAAccelerator

    settings = dict(
        accelerator=XLAAccelerator(),
        devices=1,
        strategy="single_xla",
        max_epochs=1,
        limit_train_batches=4,
        limit_val_batches=2,
        limit_test_batches=2,
        limit_predict_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    settings.update(overrides)
    return Trainer(**settings)
