"""Registers the DeepSpeed strategy names with lightning-strategies (imports nothing heavy)."""

import ctypes.util

from lightning_strategies import hookimpl

_TRAINER = "lightning_strategies_deepspeed.strategy:DeepSpeedStrategy"
_FABRIC = "lightning_strategies_deepspeed.fabric:DeepSpeedFabricStrategy"
_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")

# name -> (description, constructor defaults); the same names as Lightning's built-ins.
NAMES = {
    "deepspeed": ("DeepSpeed, ZeRO stage 2 by default", {}),
    "deepspeed_stage_1": ("DeepSpeed ZeRO stage 1: optimizer states partitioned", {"stage": 1}),
    "deepspeed_stage_2": ("DeepSpeed ZeRO stage 2: optimizer states and gradients partitioned", {"stage": 2}),
    "deepspeed_stage_2_offload": (
        "DeepSpeed ZeRO stage 2 with the optimizer offloaded to CPU",
        {"stage": 2, "offload_optimizer": True},
    ),
    "deepspeed_stage_3": (
        "DeepSpeed ZeRO stage 3: parameters, gradients and optimizer states partitioned",
        {"stage": 3},
    ),
    "deepspeed_stage_3_offload": (
        "DeepSpeed ZeRO stage 3 with optimizer and parameters offloaded to CPU",
        {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
    ),
    "deepspeed_stage_3_offload_nvme": (
        "DeepSpeed ZeRO stage 3 with optimizer and parameters offloaded to NVMe (needs libaio)",
        {
            "stage": 3,
            "offload_optimizer": True,
            "offload_parameters": True,
            "remote_device": "nvme",
            "offload_params_device": "nvme",
            "offload_optimizer_device": "nvme",
        },
    ),
}

# What each constructor parameter means, for `lightning-strategies info`; "config key" names the
# DeepSpeed setting it becomes (config.py builds the config). A config= given replaces all of these.
_ZERO = "zero_optimization"
PARAMETERS = {
    "accelerator": "The accelerator: CPU (gloo, DS_ACCELERATOR=cpu) or CUDA; set by the Trainer or Fabric.",
    "zero_optimization": f"Turn ZeRO on (config key {_ZERO}); False trains without partitioning (stage 0).",
    "stage": "ZeRO stage: 0 none, 1 optimizer states, 2 also gradients, 3 also parameters are partitioned.",
    "remote_device": "Stage 3: where parameters are created when the model is built, None (the device), 'cpu' "
    "or 'nvme'.",
    "offload_optimizer": f"Keep optimizer states in host memory or on NVMe ({_ZERO}.offload_optimizer); a number "
    "between 0 and 1 offloads that share only (stage 3, offload_optimizer.ratio; set sub_group_size too).",
    "offload_parameters": f"Stage 3: keep parameters in host memory or on NVMe ({_ZERO}.offload_param).",
    "offload_params_device": "Where offloaded parameters go: 'cpu' or 'nvme'.",
    "nvme_path": "Folder on an NVMe drive for NVMe offloading (needs libaio).",
    "params_buffer_count": "NVMe parameter offloading: number of parameter buffers (offload_param.buffer_count).",
    "params_buffer_size": "NVMe parameter offloading: size of each buffer, in elements (offload_param.buffer_size).",
    "max_in_cpu": "NVMe parameter offloading: elements kept in host memory (offload_param.max_in_cpu).",
    "offload_optimizer_device": "Where offloaded optimizer states go: 'cpu' or 'nvme'.",
    "optimizer_buffer_count": "NVMe optimizer offloading: number of buffers (offload_optimizer.buffer_count).",
    "block_size": "NVMe I/O: bytes per read or write request (aio.block_size).",
    "queue_depth": "NVMe I/O: requests in flight (aio.queue_depth).",
    "single_submit": "NVMe I/O: submit requests one by one rather than in batches (aio.single_submit).",
    "overlap_events": "NVMe I/O: overlap submitting and completing requests (aio.overlap_events).",
    "thread_count": "NVMe I/O: threads per request (aio.intra_op_parallelism, the key's current name).",
    "pin_memory": "Pin the host memory of offloaded states for faster copies to and from the GPU.",
    "sub_group_size": f"Stage 3: parameters per optimizer step group; smaller uses less memory ({_ZERO}).",
    "offloaded_gradients_in_fp32": "Stage 3 with the optimizer in host memory: accumulate the offloaded share's "
    "gradients in the fp32 gradients CPU Adam reads, not in a host buffer beside them: 2 bytes a parameter less "
    "host memory with bf16, twice the PCIe traffic (not a DeepSpeed key; the plan sets it where host memory is "
    "short; no effect with fp16).",
    "offloaded_gradients_on_gpu": "Stage 3 with the optimizer in host memory and several micro-batches a step: "
    "accumulate the offloaded share's gradients in a GPU buffer of the working precision and copy them to the host "
    "once a step, not to the host and back every micro-batch: 2 bytes a parameter of GPU memory with bf16, no host "
    "slot; offloaded_gradients_in_fp32 then has no effect (not a DeepSpeed key; no effect with fp16).",
    "contiguous_gradients": f"Copy gradients into one contiguous buffer as they are produced ({_ZERO}).",
    "overlap_comm": f"Overlap gradient reduction with the backward pass ({_ZERO}).",
    "allgather_partitions": f"Stages 1-2: all-gather updated parameters in one call rather than broadcasts ({_ZERO}).",
    "reduce_scatter": f"Stages 1-2: average gradients with reduce-scatter rather than all-reduce ({_ZERO}).",
    "allgather_bucket_size": f"Stages 1-2: elements all-gathered at once; smaller uses less memory ({_ZERO}).",
    "reduce_bucket_size": f"Elements reduced at once; smaller uses less memory ({_ZERO}).",
    "zero_allow_untested_optimizer": "Accept optimizers DeepSpeed has not tested with ZeRO.",
    "logging_batch_size_per_gpu": "Micro-batch size DeepSpeed reports throughput with; 'auto': the dataloader's.",
    "config": "A DeepSpeed config (dict or JSON file path) used instead of the one built from these parameters; "
    "PL_DEEPSPEED_CONFIG_PATH names a file the same way.",
    "logging_level": "Level of DeepSpeed's logger (logging.WARN by default).",
    "parallel_devices": "The devices to train on, one process each; set by the Trainer or Fabric.",
    "cluster_environment": "The cluster environment; set by the Trainer or Fabric.",
    "loss_scale": "fp16: a fixed loss scale; 0 scales dynamically.",
    "initial_scale_power": "fp16: the first dynamic loss scale is 2 to this power.",
    "loss_scale_window": "fp16: overflow-free steps before the dynamic loss scale grows.",
    "hysteresis": "fp16: overflows tolerated before the dynamic loss scale shrinks.",
    "min_loss_scale": "fp16: lowest dynamic loss scale.",
    "partition_activations": "Partition checkpointed activations across processes (activation_checkpointing).",
    "cpu_checkpointing": "Move checkpointed activations to host memory (activation_checkpointing).",
    "contiguous_memory_optimization": "Copy partitioned activations into one buffer; needs partition_activations.",
    "synchronize_checkpoint_boundary": "Synchronize devices at each activation checkpoint boundary.",
    "load_full_weights": "Load a single-file checkpoint of full weights instead of a DeepSpeed checkpoint folder.",
    "precision_plugin": "Precision plugin; by default the one for the precision flag.",
    "precision": "Fabric's precision plugin; by default the one for Fabric's precision flag.",
    "process_group_backend": "Process group backend: by default gloo on CPU, NCCL on CUDA.",
    "timeout": "Timeout of collective operations.",
    "exclude_frozen_parameters": "Leave parameters with requires_grad=False out of checkpoints.",
}


@hookimpl
def register_strategies(registry):
    for name, (description, init_params) in NAMES.items():
        registry.register(
            name,
            _TRAINER,
            description=description,
            init_params=init_params,
            accelerators=("cpu", "cuda"),
            precisions=_PRECISIONS,
            gradient_accumulation=True,
            fabric_target=_FABRIC,
            replaces_builtin=True,
            pip_name="lightning-strategies-deepspeed",
            parameters=PARAMETERS,
        )


@hookimpl
def environment_checks():
    from lightning_strategies.backends import jit_build_checks

    # DeepSpeed JIT-builds its ops (CPUAdam, FusedAdam, async I/O) on first use; async_io, which NVMe
    # offloading needs, builds against libaio.
    libaio = ctypes.util.find_library("aio")
    return [
        *jit_build_checks("deepspeed"),
        (
            "libaio (deepspeed NVMe offload)",
            libaio is not None,
            libaio or "not found: apt-get install libaio-dev (only deepspeed_stage_3_offload_nvme needs it)",
        ),
    ]


@hookimpl
def memory_plan_candidates(workload, machine):
    from lightning_strategies_deepspeed.memory import candidates

    return candidates(workload, machine)


@hookimpl
def checkpoint_formats():
    from lightning_strategies_deepspeed.checkpoint_layout import DEEPSPEED

    return [DEEPSPEED]
