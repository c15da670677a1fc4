"""Turning the strategy's parameters into a DeepSpeed config, and completing one at setup.

No torch or deepspeed calls, shared by the Trainer and the Fabric strategy. Every
parameter of Lightning's DeepSpeedStrategy is either written into the config where DeepSpeed
0.16-0.19 reads it, or accepted with a warning saying why it has no effect in the chosen set-up.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.exceptions import MisconfigurationException

from lightning_strategies import check_choice, check_type, warn_obsolete_parameter
from lightning_strategies_deepspeed.defaults import DEFAULTS, GRADIENT_PLACEMENT, IN_FP32, ON_GPU

STRATEGY = "DeepSpeedStrategy"
CONFIG_PATH_VARIABLE = "PL_DEEPSPEED_CONFIG_PATH"  # the variable Lightning's strategy reads too
OFFLOAD_DEVICES = ("cpu", "nvme")
REMOTE_DEVICES = (None, "cpu", "nvme")
STAGES = (0, 1, 2, 3)


_BOOLEANS = (
    "zero_optimization", "offload_parameters", "single_submit", "overlap_events",
    "pin_memory", "contiguous_gradients", "overlap_comm", "allgather_partitions", "reduce_scatter",
    "zero_allow_untested_optimizer", "partition_activations", "cpu_checkpointing",
    "contiguous_memory_optimization", "synchronize_checkpoint_boundary", "load_full_weights",
    "offloaded_gradients_in_fp32", "offloaded_gradients_on_gpu",
)  # fmt: skip
_POSITIVE_INTEGERS = (
    "params_buffer_count", "params_buffer_size", "optimizer_buffer_count", "block_size", "queue_depth",
    "thread_count", "sub_group_size", "allgather_bucket_size", "reduce_bucket_size", "loss_scale_window",
)  # fmt: skip
_NON_NEGATIVE_INTEGERS = ("max_in_cpu", "initial_scale_power", "hysteresis")
_NUMBERS = ("loss_scale", "min_loss_scale")

# Only ZeRO stages 1 and 2 read these; stage 3 gathers and reduces with its own stage3_* settings.
_STAGE_1_2_ONLY = ("allgather_partitions", "reduce_scatter", "allgather_bucket_size")
# Only ZeRO stage 3 reads these.
_STAGE_3_ONLY = ("sub_group_size", "remote_device", "offload_parameters")
_PARAMETER_OFFLOAD_ONLY = ("params_buffer_count", "params_buffer_size", "max_in_cpu")
_NVME_ONLY = ("block_size", "queue_depth", "single_submit", "overlap_events", "thread_count", "optimizer_buffer_count")
_FP16_ONLY = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")


class ConfigFileNotFoundError(FileNotFoundError, MisconfigurationException):
    """A DeepSpeed config path with no file; Lightning's Trainer strategy raises MisconfigurationException, Fabric's
    FileNotFoundError."""


class DeepSpeedConfigurationError(MisconfigurationException, ValueError):
    """A setting Lightning's DeepSpeed strategy refuses with a MisconfigurationException; a ValueError too, as ours
    raised before it took Lightning's type."""


def validate_parameters(parameters: Mapping[str, Any]) -> None:
    """Raise on a wrong type or an unknown value; nothing here depends on the machine."""
    for name in _BOOLEANS:
        check_type(STRATEGY, name, parameters[name], bool)
    _check_offload_optimizer(parameters["offload_optimizer"], parameters["stage"])
    for name in _POSITIVE_INTEGERS:
        _check_integer(name, parameters[name], minimum=1)
    for name in _NON_NEGATIVE_INTEGERS:
        _check_integer(name, parameters[name], minimum=0)
    for name in _NUMBERS:
        check_type(STRATEGY, name, parameters[name], (int, float))
        if parameters[name] < 0:
            raise ValueError(f"{STRATEGY}({name}={parameters[name]!r}) must be 0 or more.")
    check_choice(STRATEGY, "stage", parameters["stage"], STAGES)
    check_choice(STRATEGY, "remote_device", parameters["remote_device"], REMOTE_DEVICES)
    check_choice(STRATEGY, "offload_optimizer_device", parameters["offload_optimizer_device"], OFFLOAD_DEVICES)
    check_choice(STRATEGY, "offload_params_device", parameters["offload_params_device"], OFFLOAD_DEVICES)
    check_type(STRATEGY, "nvme_path", parameters["nvme_path"], (str, os.PathLike))
    check_type(STRATEGY, "logging_level", parameters["logging_level"], int)
    batch_size = parameters["logging_batch_size_per_gpu"]
    if batch_size is not None and batch_size != "auto":
        _check_integer("logging_batch_size_per_gpu", batch_size, minimum=1, also="'auto'")
    if parameters["contiguous_memory_optimization"] and not parameters["partition_activations"]:
        raise ValueError(
            f"{STRATEGY}(contiguous_memory_optimization=True) needs partition_activations=True: DeepSpeed makes "
            "partitioned activations contiguous, so there is nothing to make contiguous without partitioning."
        )


def _check_offload_optimizer(value: Any, stage: Any) -> None:
    """True/False, or the share of optimizer states kept in host memory (DeepSpeed's ZeRO-3 offload ratio)."""
    if isinstance(value, bool):
        return
    if not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(
            f"{STRATEGY}(offload_optimizer={value!r}) must be True, False, or the share of optimizer states to "
            "offload, a number above 0 and at most 1 (ZeRO stage 3 only), e.g. offload_optimizer=0.4."
        )
    if value < 1 and stage != 3:
        raise ValueError(
            f"{STRATEGY}(offload_optimizer={value!r}, stage={stage!r}): DeepSpeed offloads a share of the optimizer "
            "states only with ZeRO stage 3. Use stage=3, or offload_optimizer=True to offload all of them."
        )


def offload_ratio(parameters: Mapping[str, Any]) -> float | None:
    """The share of optimizer states offloaded, where it is less than all of them."""
    value = parameters["offload_optimizer"]
    return None if isinstance(value, bool) or value >= 1 else float(value)


def _check_integer(name: str, value: Any, minimum: int, also: str = "") -> None:
    check_type(STRATEGY, name, value, int)
    if value < minimum:
        alternative = f" (or {also})" if also else ""
        raise ValueError(f"{STRATEGY}({name}={value!r}) must be an integer of at least {minimum}{alternative}.")


def effective_stage(parameters: Mapping[str, Any]) -> int:
    return parameters["stage"] if parameters["zero_optimization"] else 0


def uses_nvme(parameters: Mapping[str, Any]) -> bool:
    stage = effective_stage(parameters)
    optimizer_on_nvme = parameters["offload_optimizer"] and parameters["offload_optimizer_device"] == "nvme"
    parameters_on_nvme = (
        stage == 3 and parameters["offload_parameters"] and parameters["offload_params_device"] == "nvme"
    )
    return stage > 0 and (
        optimizer_on_nvme or parameters_on_nvme or (stage == 3 and parameters["remote_device"] == "nvme")
    )


def warn_ineffective_parameters(parameters: Mapping[str, Any], config_given: bool) -> None:
    """Warn, once per parameter, about a value set away from its default that DeepSpeed will not use."""
    changed = {name for name, default in DEFAULTS.items() if parameters[name] != default}
    if config_given:
        ignored = changed - {"logging_level", "load_full_weights", *GRADIENT_PLACEMENT, *_FP16_ONLY}
        for name in sorted(ignored):
            warn_obsolete_parameter(
                STRATEGY, name, parameters[name], "a DeepSpeed config was given, and the config decides this setting."
            )
        return
    stage = effective_stage(parameters)
    reasons: dict[str, str] = {}
    if not parameters["zero_optimization"]:
        for name in ("stage", "offload_optimizer", "offload_parameters", "remote_device"):
            reasons[name] = "zero_optimization=False turns ZeRO off, and with it partitioning and offloading."
    if stage == 3:
        for name in _STAGE_1_2_ONLY:
            reasons[name] = (
                "only ZeRO stages 1 and 2 use it; stage 3 gathers parameters with 'stage3_prefetch_bucket_size' "
                "(pass it in config={'zero_optimization': {...}})."
            )
    else:
        for name in _STAGE_3_ONLY:
            reasons.setdefault(name, f"only ZeRO stage 3 uses it (stage={stage}).")
    if stage == 0 and parameters["offload_optimizer"]:
        reasons.setdefault("offload_optimizer", "DeepSpeed offloads the optimizer only with ZeRO stage 1, 2 or 3.")
    if not (stage == 3 and parameters["offload_parameters"] and parameters["offload_params_device"] == "nvme"):
        for name in _PARAMETER_OFFLOAD_ONLY:
            reasons.setdefault(name, "it sizes the NVMe buffers of parameter offloading, which is not in use.")
    if not uses_nvme(parameters):
        for name in _NVME_ONLY:
            reasons.setdefault(name, "it tunes NVMe offloading (asynchronous I/O), which is not in use.")
    if not (stage > 0 and (parameters["offload_optimizer"] or (stage == 3 and parameters["offload_parameters"]))):
        reasons.setdefault("pin_memory", "it pins the CPU memory of offloaded states, and nothing is offloaded.")
    if not (stage == 3 and parameters["offload_optimizer"] and parameters["offload_optimizer_device"] == "cpu"):
        for name in GRADIENT_PLACEMENT:
            reasons.setdefault(name, "only ZeRO stage 3 with the optimizer offloaded to host memory uses it.")
    if parameters[ON_GPU]:
        reasons.setdefault(
            IN_FP32,
            "offloaded_gradients_on_gpu=True accumulates the offloaded share's gradients on the GPU; the host then "
            "holds only their fp32 gradients already.",
        )
    if offload_ratio(parameters) is not None and parameters["sub_group_size"] == DEFAULTS["sub_group_size"]:
        # DeepSpeed splits each process's partition into sub-groups of sub_group_size elements and places
        # whole sub-groups: with the default size there is one, and any ratio offloads all of it.
        warn_obsolete_parameter(
            STRATEGY,
            "offload_optimizer",
            parameters["offload_optimizer"],
            "with sub_group_size at its default each process has one sub-group, which DeepSpeed places whole, so "
            "all optimizer states are offloaded. Pass sub_group_size of about a twentieth of each process's "
            "parameters (`lightning-strategies plan` chooses both).",
        )
    for name in sorted(changed & set(reasons)):
        warn_obsolete_parameter(STRATEGY, name, parameters[name], reasons[name])


def build_config(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config the parameters describe (before the Trainer's settings are added)."""
    config: dict[str, Any] = {
        "activation_checkpointing": {
            "partition_activations": parameters["partition_activations"],
            "cpu_checkpointing": parameters["cpu_checkpointing"],
            "contiguous_memory_optimization": parameters["contiguous_memory_optimization"],
            "synchronize_checkpoint_boundary": parameters["synchronize_checkpoint_boundary"],
        },
        "aio": {
            "block_size": parameters["block_size"],
            "queue_depth": parameters["queue_depth"],
            "single_submit": parameters["single_submit"],
            "overlap_events": parameters["overlap_events"],
            # DeepSpeed renamed thread_count; it silently ignores the old key.
            "intra_op_parallelism": parameters["thread_count"],
        },
    }
    stage = effective_stage(parameters)
    if stage > 0:
        zero: dict[str, Any] = {
            "stage": stage,
            "contiguous_gradients": parameters["contiguous_gradients"],
            "overlap_comm": parameters["overlap_comm"],
            "reduce_bucket_size": parameters["reduce_bucket_size"],
        }
        if stage < 3:
            zero["allgather_partitions"] = parameters["allgather_partitions"]
            zero["reduce_scatter"] = parameters["reduce_scatter"]
            zero["allgather_bucket_size"] = parameters["allgather_bucket_size"]
        else:
            zero["sub_group_size"] = parameters["sub_group_size"]
        if parameters["offload_optimizer"]:
            zero["offload_optimizer"] = {
                "device": parameters["offload_optimizer_device"],
                "nvme_path": str(parameters["nvme_path"]),
                "buffer_count": parameters["optimizer_buffer_count"],
                "pin_memory": parameters["pin_memory"],
            }
            if offload_ratio(parameters) is not None:
                zero["offload_optimizer"]["ratio"] = offload_ratio(parameters)
        if stage == 3 and parameters["offload_parameters"]:
            zero["offload_param"] = {
                "device": parameters["offload_params_device"],
                "nvme_path": str(parameters["nvme_path"]),
                "buffer_count": parameters["params_buffer_count"],
                "buffer_size": parameters["params_buffer_size"],
                "max_in_cpu": parameters["max_in_cpu"],
                "pin_memory": parameters["pin_memory"],
            }
            if parameters["offload_params_device"] == "nvme":
                # Each gathered parameter holds one of the buffer_count swap buffers until it is released, and
                # DeepSpeed keeps any parameter used again within stage3_max_reuse_distance elements (1e9 by
                # default: every parameter of a 1B model at the turn from forward to backward), which runs out
                # of buffers ("Not enough buffers 0 for swapping 1"). Releasing each after use cannot.
                zero["stage3_max_reuse_distance"] = 0
        config["zero_optimization"] = zero
        config["zero_allow_untested_optimizer"] = parameters["zero_allow_untested_optimizer"]
    batch_size = parameters["logging_batch_size_per_gpu"]
    if batch_size not in (None, "auto"):
        config["train_micro_batch_size_per_gpu"] = batch_size
    return config


def load_user_config(config: str | os.PathLike | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The config passed in (a dict, or a JSON file), or the file named by PL_DEEPSPEED_CONFIG_PATH."""
    if config is None:
        config = os.environ.get(CONFIG_PATH_VARIABLE) or None
        if config is None:
            return None
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(
            f"{STRATEGY}(config={config!r}) must be a dict or the path of a DeepSpeed JSON config file, "
            f"not {type(config).__name__}."
        )
    path = Path(config)
    if not path.is_file():
        raise ConfigFileNotFoundError(
            f"You passed in a path to a DeepSpeed config but the path does not exist: {config}. "
            f"{STRATEGY}(config=...) takes the path of a DeepSpeed JSON config, or a dict."
        )
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{STRATEGY}: the DeepSpeed config {str(path)!r} is not valid JSON: {error}") from None
    if not isinstance(loaded, dict):
        raise ValueError(
            f"{STRATEGY}: the DeepSpeed config {str(path)!r} must hold a JSON object, not {type(loaded).__name__}."
        )
    return loaded


def check_device_indices(devices: Sequence[Any]) -> None:
    """Refuse CUDA devices other than cuda:0..N-1 in rank order: DeepSpeed puts each process on cuda:<local rank>.

    Lightning would run local rank r on ``devices[r]`` and DeepSpeed on cuda:r, so devices=[1, 0] or [0, 2]
    would train (and reduce) on other GPUs than the ones chosen, or two processes on one GPU.
    """
    indices = [device.index for device in devices if device.type == "cuda"]
    if not indices or indices == list(range(len(devices))):
        return
    visible = ",".join(str(index) for index in indices)
    raise RuntimeError(
        f"The selected device indices {indices!r} don't match the local rank values of processes. If you need to "
        "select GPUs at a specific index, set the `CUDA_VISIBLE_DEVICES` environment variable instead. For example: "
        f"`CUDA_VISIBLE_DEVICES={visible}`. DeepSpeed runs each process on the GPU numbered as its local rank, so "
        f"choose them with CUDA_VISIBLE_DEVICES={visible} and devices={len(devices)}."
    )


def zero_stage(config: Mapping[str, Any]) -> int:
    return int((config.get("zero_optimization") or {}).get("stage", 0))


def add_precision(config: dict[str, Any], precision: str, parameters: Mapping[str, Any]) -> None:
    """Enable DeepSpeed's fp16 (with the loss-scaling parameters) or bf16 for a Lightning precision flag.

    A section the user's config already has is left alone.
    """
    if precision in ("16-mixed", "16-true"):
        if "fp16" not in config and "bf16" not in config:
            config["fp16"] = {
                "enabled": True,
                "loss_scale": parameters["loss_scale"],
                "initial_scale_power": parameters["initial_scale_power"],
                "loss_scale_window": parameters["loss_scale_window"],
                "hysteresis": parameters["hysteresis"],
                "min_loss_scale": parameters["min_loss_scale"],
            }
        return
    changed = [name for name in _FP16_ONLY if parameters[name] != DEFAULTS[name]]
    for name in changed:
        warn_obsolete_parameter(
            STRATEGY, name, parameters[name], f"loss scaling is for fp16, and precision is {precision!r}."
        )
    if precision in ("bf16-mixed", "bf16-true") and "bf16" not in config and "fp16" not in config:
        config["bf16"] = {"enabled": True}


def resolve_accumulation(config: Mapping[str, Any], accumulate_grad_batches: int) -> int:
    """The number of micro-batches per optimizer step, agreed between the Trainer and the config.

    A config's ``gradient_accumulation_steps`` is used when the Trainer keeps its default of 1;
    two different values are an error, since either could be the one meant.
    """
    configured = config.get("gradient_accumulation_steps")
    if configured in (None, "auto"):
        return accumulate_grad_batches
    if not isinstance(configured, int) or isinstance(configured, bool) or configured < 1:
        # Not Lightning's words ("Do not set `gradient_accumulation_steps`"): with Fabric the config is where
        # accumulation is set, and ours reads it with the Trainer too.
        raise DeepSpeedConfigurationError(
            f"DeepSpeed config gradient_accumulation_steps={configured!r} must be a positive integer."
        )
    if accumulate_grad_batches not in (1, configured):
        raise DeepSpeedConfigurationError(
            "Do not set `gradient_accumulation_steps` in the DeepSpeed config as this will be set with the "
            "`accumulate_grad_batches` argument passed via the Lightning Trainer. Here Trainer("
            f"accumulate_grad_batches={accumulate_grad_batches}) and the config's gradient_accumulation_steps="
            f"{configured} disagree: set one of them (or both to the same value)."
        )
    return configured


def add_batch_settings(config: dict[str, Any], micro_batch_size: int, accumulation: int, world_size: int) -> None:
    """Fill in the batch arithmetic DeepSpeed checks: train = micro x accumulation x world size."""
    config["gradient_accumulation_steps"] = accumulation
    if config.get("train_micro_batch_size_per_gpu") in (None, "auto"):
        train_batch_size = config.get("train_batch_size")
        if isinstance(train_batch_size, int) and train_batch_size % (accumulation * world_size) == 0:
            micro_batch_size = train_batch_size // (accumulation * world_size)
        config["train_micro_batch_size_per_gpu"] = micro_batch_size
    if config.get("train_batch_size") == "auto":
        del config["train_batch_size"]


def add_gradient_clipping(config: dict[str, Any], clip_value: float | None, algorithm: str | None) -> None:
    """Clip as the Trainer says. DeepSpeed's own default clips at norm 1.0, which Lightning users never asked for."""
    if clip_value is None:
        if config.get("gradient_clipping") in (None, "auto"):
            config["gradient_clipping"] = 0.0
        return
    if algorithm not in (None, "norm"):
        raise DeepSpeedConfigurationError(
            f"DeepSpeed does not support clipping gradients by value. Trainer(gradient_clip_algorithm={algorithm!r}): "
            "DeepSpeed clips by the gradients' global norm only. Use gradient_clip_algorithm='norm'."
        )
    configured = config.get("gradient_clipping")
    if configured not in (None, "auto", 0, 0.0) and float(configured) != float(clip_value):
        raise ValueError(
            f"Trainer(gradient_clip_val={clip_value}) and the DeepSpeed config's gradient_clipping={configured} "
            "disagree. Set one of them."
        )
    config["gradient_clipping"] = float(clip_value)


def allow_any_optimizer_on_cpu(config: dict[str, Any], device_type: str) -> None:
    """Let offloading use any torch optimizer when training on CPU.

    DeepSpeed refuses a client optimizer with CPU offload unless it is its own CPUAdam, because on
    a GPU host the torch optimizer would be slow; on CPU everything already runs on CPU. A config's
    own ``zero_force_ds_cpu_optimizer`` is kept.
    """
    if device_type == "cpu":
        config.setdefault("zero_force_ds_cpu_optimizer", False)
