"""Every seed parameter lands in the DeepSpeed config, or warns why it cannot; bad values are refused."""

from __future__ import annotations

import inspect
import json
import warnings

import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from lightning_strategies.parameters import ObsoleteParameterWarning
from lightning_strategies.testing import check_trainer_and_fabric_agree
from lightning_strategies_deepspeed import config as settings
from lightning_strategies_deepspeed.defaults import DEFAULTS
from lightning_strategies_deepspeed.fabric import DeepSpeedFabricStrategy
from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy

# The constructor parameters that are no DeepSpeed setting: Lightning's DDPStrategy takes them, or the strategy
# keeps them. Every other parameter has its default in defaults.py.
NOT_DEEPSPEED_SETTINGS = {
    "accelerator", "config", "parallel_devices", "cluster_environment", "process_group_backend", "timeout",
    "exclude_frozen_parameters",
}  # fmt: skip


def build(**changes):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ObsoleteParameterWarning)
        return DeepSpeedStrategy(**changes).config


def test_stage_2_defaults_match_the_seed():
    config = build()
    zero = config["zero_optimization"]
    assert zero == {
        "stage": 2, "contiguous_gradients": True, "overlap_comm": True, "reduce_bucket_size": 200_000_000,
        "allgather_partitions": True, "reduce_scatter": True, "allgather_bucket_size": 200_000_000,
    }  # fmt: skip
    assert config["zero_allow_untested_optimizer"] is True
    assert "train_micro_batch_size_per_gpu" not in config  # "auto": taken from the train loader at setup


def test_every_zero_and_offload_parameter_is_written():
    config = build(
        stage=3, offload_optimizer=True, offload_parameters=True, offload_optimizer_device="nvme",
        offload_params_device="nvme", nvme_path="/fast", params_buffer_count=7, params_buffer_size=123,
        max_in_cpu=456, optimizer_buffer_count=5, block_size=4096, queue_depth=16, single_submit=True,
        overlap_events=False, thread_count=3, pin_memory=True, sub_group_size=1000, contiguous_gradients=False,
        overlap_comm=False, reduce_bucket_size=99, zero_allow_untested_optimizer=False, logging_batch_size_per_gpu=8,
        remote_device="nvme", partition_activations=True, cpu_checkpointing=True,
        contiguous_memory_optimization=True, synchronize_checkpoint_boundary=True,
    )  # fmt: skip
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["sub_group_size"] == 1000 and zero["reduce_bucket_size"] == 99
    # Parameters kept for reuse each hold an NVMe swap buffer; DeepSpeed's default keeps more than there are.
    assert zero["stage3_max_reuse_distance"] == 0
    assert zero["contiguous_gradients"] is False and zero["overlap_comm"] is False
    assert zero["offload_optimizer"] == {"device": "nvme", "nvme_path": "/fast", "buffer_count": 5, "pin_memory": True}
    assert zero["offload_param"] == {
        "device": "nvme", "nvme_path": "/fast", "buffer_count": 7, "buffer_size": 123, "max_in_cpu": 456,
        "pin_memory": True,
    }  # fmt: skip
    # thread_count is DeepSpeed's intra_op_parallelism now; the old key would be ignored silently.
    assert config["aio"] == {
        "block_size": 4096, "queue_depth": 16, "single_submit": True, "overlap_events": False,
        "intra_op_parallelism": 3,
    }  # fmt: skip
    assert config["activation_checkpointing"] == {
        "partition_activations": True, "cpu_checkpointing": True, "contiguous_memory_optimization": True,
        "synchronize_checkpoint_boundary": True,
    }  # fmt: skip
    assert config["zero_allow_untested_optimizer"] is False
    assert config["train_micro_batch_size_per_gpu"] == 8


def test_loss_scaling_goes_into_fp16_section():
    config = {}
    parameters = {**settings.DEFAULTS, "loss_scale": 128.0, "initial_scale_power": 10, "loss_scale_window": 50,
                  "hysteresis": 3, "min_loss_scale": 2}  # fmt: skip
    settings.add_precision(config, "16-mixed", parameters)
    assert config["fp16"] == {"enabled": True, "loss_scale": 128.0, "initial_scale_power": 10,
                              "loss_scale_window": 50, "hysteresis": 3, "min_loss_scale": 2}  # fmt: skip
    bf16 = {}
    with pytest.warns(ObsoleteParameterWarning, match="loss scaling is for fp16"):
        settings.add_precision(bf16, "bf16-mixed", parameters)
    assert bf16 == {"bf16": {"enabled": True}}


@pytest.mark.parametrize(
    ("changes", "parameter", "reason"),
    [
        ({"stage": 3, "allgather_bucket_size": 10}, "allgather_bucket_size", "only ZeRO stages 1 and 2"),
        ({"stage": 3, "reduce_scatter": False}, "reduce_scatter", "only ZeRO stages 1 and 2"),
        ({"stage": 2, "offload_parameters": True}, "offload_parameters", "only ZeRO stage 3"),
        ({"stage": 2, "sub_group_size": 5}, "sub_group_size", "only ZeRO stage 3"),
        ({"stage": 1, "remote_device": "cpu"}, "remote_device", "only ZeRO stage 3"),
        ({"queue_depth": 4}, "queue_depth", "NVMe offloading"),
        ({"params_buffer_count": 9}, "params_buffer_count", "parameter offloading"),
        ({"pin_memory": True}, "pin_memory", "nothing is offloaded"),
        ({"stage": 2, "offloaded_gradients_on_gpu": True}, "offloaded_gradients_on_gpu", "only ZeRO stage 3 with"),
        (
            {
                "stage": 3,
                "offload_optimizer": True,
                "offloaded_gradients_on_gpu": True,
                "offloaded_gradients_in_fp32": True,
            },
            "offloaded_gradients_in_fp32",
            "accumulates the offloaded share's gradients on the GPU",
        ),
        ({"zero_optimization": False, "stage": 3}, "stage", "zero_optimization=False"),
        ({"config": {"train_micro_batch_size_per_gpu": 1}, "stage": 3}, "stage", "config decides"),
    ],
)
def test_ineffective_parameter_warns_with_reason(changes, parameter, reason):
    with pytest.warns(ObsoleteParameterWarning, match=f"{parameter}=.*{reason}"):
        DeepSpeedStrategy(**changes)


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"stage": 4}, ValueError, r"stage=4.*Choose one of: 0, 1, 2, 3"),
        ({"offload_optimizer_device": "gpu"}, ValueError, r"offload_optimizer_device='gpu'.*'cpu', 'nvme'"),
        ({"offload_params_device": "disk"}, ValueError, r"'cpu', 'nvme'"),
        ({"remote_device": "cuda"}, ValueError, r"remote_device='cuda'.*None, 'cpu', 'nvme'"),
        ({"overlap_comm": "yes"}, TypeError, r"overlap_comm='yes'\) must be bool"),
        ({"reduce_bucket_size": 0}, ValueError, r"reduce_bucket_size=0\) must be an integer of at least 1"),
        ({"reduce_bucket_size": 1.5}, TypeError, r"must be int"),
        ({"logging_batch_size_per_gpu": "big"}, TypeError, r"logging_batch_size_per_gpu"),
        ({"loss_scale": -1}, ValueError, r"loss_scale=-1\) must be 0 or more"),
        ({"contiguous_memory_optimization": True}, ValueError, r"needs partition_activations=True"),
        ({"config": 42}, TypeError, r"must be a dict or the path"),
        ({"config": "/no/such/ds_config.json"}, FileNotFoundError, r"the path does not exist"),
    ],
)
def test_bad_values_are_refused_with_the_fix(changes, error, message):
    with pytest.raises(error, match=message):
        DeepSpeedStrategy(**changes)


def test_config_file_and_environment_variable(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert DeepSpeedStrategy(config=str(path)).zero_stage_3
    monkeypatch.setenv(settings.CONFIG_PATH_VARIABLE, str(path))
    assert DeepSpeedStrategy().config == {"zero_optimization": {"stage": 3}}
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DeepSpeedStrategy(config=broken)


@pytest.mark.parametrize("strategy_class", [DeepSpeedStrategy, DeepSpeedFabricStrategy])
def test_a_missing_config_file_is_the_error_lightning_raises(strategy_class):
    # Lightning's Trainer strategy raises MisconfigurationException there, its Fabric strategy FileNotFoundError.
    for error in (MisconfigurationException, FileNotFoundError):
        with pytest.raises(error, match=r"the path does not exist: /no/such/ds_config\.json\. DeepSpeedStrategy"):
            strategy_class(config="/no/such/ds_config.json")


@pytest.mark.parametrize("indices", [[1, 0], [0, 2], [1]])
@pytest.mark.parametrize("strategy_class", [DeepSpeedStrategy, DeepSpeedFabricStrategy])
def test_gpus_other_than_the_local_ranks_are_refused(strategy_class, indices):
    # No CUDA call happens before the check, so it runs on any machine.
    strategy = strategy_class(parallel_devices=[torch.device("cuda", index) for index in indices])
    setup = strategy.setup_distributed if strategy_class is DeepSpeedStrategy else strategy._setup_distributed
    expected = rf"CUDA_VISIBLE_DEVICES={','.join(map(str, indices))} and devices={len(indices)}"
    with pytest.raises(RuntimeError, match=expected):
        setup()


@pytest.mark.parametrize("devices", [[torch.device("cuda", 0), torch.device("cuda", 1)], [torch.device("cpu")] * 2])
def test_gpus_in_local_rank_order_and_cpus_pass_the_device_check(devices):
    assert settings.check_device_indices(devices) is None


def test_newer_deepspeed_options_pass_through_untouched():
    """ZeRO++ (quantized weights/gradients, hierarchical partitioning) and other 0.17+ keys reach DeepSpeed as given."""
    config = {
        "zero_optimization": {
            "stage": 3, "zero_quantized_weights": True, "zero_quantized_gradients": True, "zero_hpz_partition_size": 2,
            "stage3_module_granularity_threshold": 100, "log_trace_cache_warnings": True,
        },
        "checkpoint": {"load_universal": False},
        "torch_autocast": {"enabled": False},
    }  # fmt: skip
    strategy = DeepSpeedStrategy(config=config)
    assert strategy.config == config
    assert strategy.config is not config  # the caller's dict is not modified later


def test_deepspeed_accepts_passthrough_config():
    """DeepSpeed 0.19's own config parser takes the passed-through options (no engine needed)."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = DeepSpeedZeroConfig(**{"stage": 3, "zero_quantized_weights": True, "zero_hpz_partition_size": 2})
    assert zero.zero_quantized_weights and zero.zero_hpz_partition_size == 2


@pytest.mark.parametrize(
    ("configured", "trainer", "expected"),
    [(None, 1, 1), (None, 4, 4), (3, 1, 3), (3, 3, 3), ("auto", 2, 2)],
)
def test_accumulation_agreed_between_trainer_and_config(configured, trainer, expected):
    config = {} if configured is None else {"gradient_accumulation_steps": configured}
    assert settings.resolve_accumulation(config, trainer) == expected


def test_accumulation_disagreement_is_an_error():
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=2.*gradient_accumulation_steps=4 disagree"):
        settings.resolve_accumulation({"gradient_accumulation_steps": 4}, 2)


def test_clipping():
    config = {}
    settings.add_gradient_clipping(config, None, None)
    assert config == {"gradient_clipping": 0.0}  # DeepSpeed would clip at 1.0 by default
    config = {}
    settings.add_gradient_clipping(config, 0.5, "norm")
    assert config == {"gradient_clipping": 0.5}
    with pytest.raises(ValueError, match="clips by the gradients' global norm only"):
        settings.add_gradient_clipping({}, 0.5, "value")
    with pytest.raises(ValueError, match="disagree"):
        settings.add_gradient_clipping({"gradient_clipping": 2.0}, 0.5, "norm")


def test_batch_arithmetic():
    config = {"train_batch_size": 32}
    settings.add_batch_settings(config, 1, accumulation=2, world_size=2)
    assert config["train_micro_batch_size_per_gpu"] == 8
    config = {}
    settings.add_batch_settings(config, 4, accumulation=1, world_size=2)
    assert config == {"gradient_accumulation_steps": 1, "train_micro_batch_size_per_gpu": 4}


def test_trainer_and_fabric_constructors_agree():
    """One constructor (body.py) serves both: LightningCLI and ``lightning-strategies info`` read each signature in
    full, equal but for the precision plugin, named after each entry point's Lightning base class."""
    check_trainer_and_fabric_agree(DeepSpeedStrategy, DeepSpeedFabricStrategy)
    assert "precision_plugin" in inspect.signature(DeepSpeedStrategy).parameters
    assert "precision" in inspect.signature(DeepSpeedFabricStrategy).parameters
    with pytest.raises(TypeError, match="precision"):
        DeepSpeedStrategy(precision=None)  # Fabric's name is no Trainer parameter, as in Lightning


@pytest.mark.parametrize("strategy_class", [DeepSpeedStrategy, DeepSpeedFabricStrategy])
def test_a_wrong_call_names_the_class_the_user_called(strategy_class):
    """Python words these errors after the constructor's code: each face's copy carries the face's name, not the
    body's, which users never see."""
    face = strategy_class.__qualname__
    with pytest.raises(TypeError, match=rf"^{face}\.__init__\(\) got an unexpected keyword argument 'stag'"):
        strategy_class(stag=3)
    with pytest.raises(TypeError, match=rf"^{face}\.__init__\(\) got multiple values for argument 'accelerator'"):
        strategy_class(None, accelerator=None)


@pytest.mark.parametrize("strategy_class", [DeepSpeedStrategy, DeepSpeedFabricStrategy])
def test_constructor_defaults_are_those_of_defaults_py(strategy_class):
    parameters = inspect.signature(strategy_class).parameters
    assert {name: parameters[name].default for name in DEFAULTS if name in parameters} == DEFAULTS
    assert set(parameters) - set(DEFAULTS) == NOT_DEEPSPEED_SETTINGS | {strategy_class.precision_keyword}
