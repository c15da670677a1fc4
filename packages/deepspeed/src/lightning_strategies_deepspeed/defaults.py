"""The DeepSpeed strategies' constructor defaults, in a module that imports nothing heavy: the memory
planner reads them without loading Lightning (config.py imports it for its exception types)."""

from __future__ import annotations

import logging
from typing import Any

# This package's own settings, read by the strategy rather than written into DeepSpeed's config: where ZeRO-3's
# offloaded share accumulates its gradients (gradient_buffers.py); with neither, in 16-bit host slots.
IN_FP32, ON_GPU = "offloaded_gradients_in_fp32", "offloaded_gradients_on_gpu"
GRADIENT_PLACEMENT = (IN_FP32, ON_GPU)

# The constructor parameters that shape the config, with the defaults of the seed API.
DEFAULTS: dict[str, Any] = {
    "zero_optimization": True,
    "stage": 2,
    "remote_device": None,
    "offload_optimizer": False,
    "offload_parameters": False,
    "offload_params_device": "cpu",
    "nvme_path": "/local_nvme",
    "params_buffer_count": 5,
    "params_buffer_size": 100_000_000,
    "max_in_cpu": 1_000_000_000,
    "offload_optimizer_device": "cpu",
    "optimizer_buffer_count": 4,
    "block_size": 1048576,
    "queue_depth": 8,
    "single_submit": False,
    "overlap_events": True,
    "thread_count": 1,
    "pin_memory": False,
    "sub_group_size": 1_000_000_000_000,
    "offloaded_gradients_in_fp32": False,
    "offloaded_gradients_on_gpu": False,
    "contiguous_gradients": True,
    "overlap_comm": True,
    "allgather_partitions": True,
    "reduce_scatter": True,
    "allgather_bucket_size": 200_000_000,
    "reduce_bucket_size": 200_000_000,
    "zero_allow_untested_optimizer": True,
    "logging_batch_size_per_gpu": "auto",
    "logging_level": logging.WARN,
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "partition_activations": False,
    "cpu_checkpointing": False,
    "contiguous_memory_optimization": False,
    "synchronize_checkpoint_boundary": False,
    "load_full_weights": False,
}
