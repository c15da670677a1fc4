"""The one body of the Trainer and Fabric DeepSpeed strategies: what DeepSpeed needs whichever loop drives it.

``strategy.py`` (Trainer) and ``fabric.py`` (Fabric) mix ``DeepSpeedBody`` in before their Lightning
``DDPStrategy`` and keep only what their entry point asks for. This module imports nothing of the Trainer
(``lightning.pytorch``), so the Fabric strategy loads without it.

The constructor is written once, here, with the parameters of Lightning's DeepSpeed strategies in their order
and the DeepSpeed settings' defaults of ``defaults.py``. Each face takes a copy under its own name (core's
``constructor_for``, so a wrong call's error names the class the user called): Fabric's as written, the Trainer's
with ``precision`` named ``precision_plugin``, as each entry point's ``DDPStrategy`` names it.
``tests/test_parameters.py`` holds the two signatures in agreement.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import torch
from lightning.fabric.accelerators import Accelerator
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_strategies.checkpoints import recover, staged_save
from lightning_strategies.ranks import watch_ranks
from lightning_strategies_deepspeed import checkpoint as checkpoints
from lightning_strategies_deepspeed import config as settings
from lightning_strategies_deepspeed.backend import begin_run, check_accelerator, export_ranks, import_deepspeed
from lightning_strategies_deepspeed.defaults import DEFAULTS, GRADIENT_PLACEMENT, IN_FP32, ON_GPU
from lightning_strategies_deepspeed.gradient_buffers import (
    accumulation_hint,
    describe,
    keep_gradients_with_their_optimizer,
)
from lightning_strategies_deepspeed.lightning_attributes import LightningAttributesMixin
from lightning_strategies_deepspeed.partitioned_models import finish_partitioned_models, warn_compiled_modules

# The precision flags DeepSpeed trains with, and the dtype each casts inputs (and, for "-true", the module) to.
DTYPES = {
    "32-true": torch.float32,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
}


class _ParallelStrategy(Protocol):
    """What the body uses of the Lightning ``DDPStrategy`` (Trainer's or Fabric's) it is mixed into."""

    parameters: dict[str, Any]
    config: dict[str, Any]
    remote_device: str | None
    exclude_frozen_parameters: bool
    parallel_devices: list[torch.device] | None
    cluster_environment: ClusterEnvironment | None
    _process_group_backend: str | None
    _config_completed: bool
    _end_run: weakref.finalize | None

    @property
    def root_device(self) -> torch.device: ...

    @property
    def accelerator(self) -> Any: ...

    @property
    def world_size(self) -> int: ...

    @property
    def global_rank(self) -> int: ...

    @property
    def is_global_zero(self) -> bool: ...

    @property
    def zero_stage_3(self) -> bool: ...

    def broadcast(self, obj: Any, src: int = 0) -> Any: ...

    def barrier(self, *args: Any, **kwargs: Any) -> None: ...


class DeepSpeedBody(LightningAttributesMixin):
    """The parameters, the config built from them, the engine and its checkpoints, for both entry points."""

    parameters: dict[str, Any]
    config: dict[str, Any]
    remote_device: str | None
    load_full_weights: bool
    exclude_frozen_parameters: bool

    # The keyword each entry point's DDPStrategy takes the precision plugin by: "precision_plugin" or "precision".
    precision_keyword: ClassVar[str]
    # Undoes what the run under way changed in the process; set at set-up, before which there is nothing to undo.
    _end_run: weakref.finalize | None = None

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        zero_optimization: bool = True,
        stage: int = 2,
        remote_device: str | None = None,
        offload_optimizer: bool | float = False,
        offload_parameters: bool = False,
        offload_params_device: str = "cpu",
        nvme_path: str = "/local_nvme",
        params_buffer_count: int = 5,
        params_buffer_size: int = 100_000_000,
        max_in_cpu: int = 1_000_000_000,
        offload_optimizer_device: str = "cpu",
        optimizer_buffer_count: int = 4,
        block_size: int = 1048576,
        queue_depth: int = 8,
        single_submit: bool = False,
        overlap_events: bool = True,
        thread_count: int = 1,
        pin_memory: bool = False,
        sub_group_size: int = 1_000_000_000_000,
        offloaded_gradients_in_fp32: bool = False,
        offloaded_gradients_on_gpu: bool = False,
        contiguous_gradients: bool = True,
        overlap_comm: bool = True,
        allgather_partitions: bool = True,
        reduce_scatter: bool = True,
        allgather_bucket_size: int = 200_000_000,
        reduce_bucket_size: int = 200_000_000,
        zero_allow_untested_optimizer: bool = True,
        logging_batch_size_per_gpu: int | Literal["auto"] | None = "auto",
        config: str | Path | dict[str, Any] | None = None,
        logging_level: int = logging.WARN,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        loss_scale: float = 0,
        initial_scale_power: int = 16,
        loss_scale_window: int = 1000,
        hysteresis: int = 2,
        min_loss_scale: int = 1,
        partition_activations: bool = False,
        cpu_checkpointing: bool = False,
        contiguous_memory_optimization: bool = False,
        synchronize_checkpoint_boundary: bool = False,
        load_full_weights: bool = False,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        exclude_frozen_parameters: bool = False,
    ) -> None:
        """Bad values are refused before Lightning's constructor runs, as Lightning's DeepSpeed strategy does."""
        arguments = locals()
        parameters = {name: arguments[name] for name in DEFAULTS}
        settings.validate_parameters(parameters)
        user_config = settings.load_user_config(config)
        settings.warn_ineffective_parameters(parameters, config_given=user_config is not None)
        super().__init__(  # type: ignore[call-arg]  # Lightning's strategy, after this mixin
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            process_group_backend=process_group_backend,
            timeout=timeout,
            **{self.precision_keyword: precision},
        )
        self.parameters = parameters
        self.config = user_config if user_config is not None else settings.build_config(parameters)
        self.remote_device = remote_device
        self.load_full_weights = load_full_weights
        self.exclude_frozen_parameters = exclude_frozen_parameters
        self._config_completed = False
        self._finish_init(precision)

    def _finish_init(self, precision: Precision | None) -> None:
        """What a face sets up after the shared constructor; ``precision`` is the plugin it was given, if any."""

    @property
    def zero_stage_3(self) -> bool:
        return settings.zero_stage(self.config) == 3

    @property
    def distributed_sampler_kwargs(self: _ParallelStrategy) -> dict[str, int]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # -- start-up ----------------------------------------------------------------------------

    def setup_environment(self: _ParallelStrategy) -> None:
        check_accelerator(self.root_device.type, self.accelerator)
        # What the run changes in the process is undone at teardown; Fabric never tears its strategy down,
        # so there it is undone once the strategy is gone (or the next run begins).
        self._end_run = weakref.finalize(self, begin_run().undo)
        # Before anything else imports deepspeed: its accelerator follows Lightning's device.
        import_deepspeed(self.root_device.type, self.parameters["logging_level"])
        super().setup_environment()  # type: ignore[misc]

    def teardown(self: _ParallelStrategy) -> None:
        super().teardown()  # type: ignore[misc]
        if self._end_run is not None:
            self._end_run()

    def _check_devices(self: _ParallelStrategy) -> None:
        assert self.parallel_devices is not None
        settings.check_device_indices(self.parallel_devices)

    def _attach_deepspeed(self: _ParallelStrategy) -> None:
        """Once Lightning created the process group: DeepSpeed's communication layer joins it."""
        watch_ranks(self.global_rank, self.world_size)
        deepspeed = import_deepspeed(self.root_device.type)
        assert self.cluster_environment is not None
        export_ranks(self.cluster_environment)
        deepspeed.init_distributed(
            dist_backend=self._process_group_backend, auto_mpi_discovery=False, dist_init_required=False
        )

    def _complete_config(
        self: _ParallelStrategy,
        precision: str,
        accumulation: int,
        micro_batch_size: int,
        clip_value: float | None = None,
        clip_algorithm: str | None = None,
    ) -> int:
        """Add what is known only at set-up; returns the accumulation the config settles on."""
        config = self.config
        settings.add_precision(config, precision, self.parameters)
        accumulation = settings.resolve_accumulation(config, accumulation)
        settings.add_batch_settings(config, micro_batch_size, accumulation, self.world_size)
        settings.add_gradient_clipping(config, clip_value, clip_algorithm)
        settings.allow_any_optimizer_on_cpu(config, self.root_device.type)
        self._config_completed = True
        return accumulation

    # -- the engine --------------------------------------------------------------------------

    def _initialize_engine(
        self: _ParallelStrategy, module: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None
    ) -> tuple[Any, Any, Any, Any]:
        """The training engine: engine, its optimizer, data loader (unused) and scheduler, as DeepSpeed returns."""
        deepspeed = import_deepspeed(self.root_device.type)
        with explained_parameter_buffers():
            initialized = deepspeed.initialize(
                config=self.config,
                model=module,
                model_parameters=[parameter for parameter in module.parameters() if parameter.requires_grad],
                optimizer=optimizer,
                lr_scheduler=lr_scheduler,
                dist_init_required=False,
            )
        placement = keep_gradients_with_their_optimizer(
            initialized[0].optimizer,
            self.root_device,
            in_fp32=self.parameters[IN_FP32],
            accumulate_on=self.root_device if self.parameters[ON_GPU] else None,
        )
        given = [name for name in GRADIENT_PLACEMENT if self.parameters[name]]
        if placement is None and given:
            # config.py warns for settings without an optimizer offload; this is what only the engine tells.
            rank_zero_warn(
                f"DeepSpeedStrategy({', '.join(f'{name}=True' for name in given)}) has no "
                "effect here: it needs ZeRO stage 3 with the optimizer offloaded to host memory and bf16 or fp32 "
                "(fp16's overflow check reads DeepSpeed's own 16-bit buffer). Remove it, or train with "
                "precision='bf16-mixed'."
            )
        if placement is not None:
            rank_zero_info(describe(placement, self.root_device))
            engine = initialized[0]
            element_bytes = engine.optimizer.grad_partitions_flat_buffer.element_size()
            hint = accumulation_hint(placement, engine.gradient_accumulation_steps(), element_bytes)
            if hint:
                rank_zero_info(hint)
        return initialized

    def _initialize_evaluation_engine(self: _ParallelStrategy, module: torch.nn.Module, **extra: Any) -> Any:
        """An engine without optimizer: only precision and (for ZeRO-3) partitioning apply, plus ``extra``."""
        deepspeed = import_deepspeed(self.root_device.type)
        if self.zero_stage_3 and any(hasattr(parameter, "ds_id") for parameter in module.parameters()):
            # Partitioned by an earlier fit, whose teardown moved the module to the CPU: that moved only
            # the empty placeholders ZeRO-3 gathers into, and trainer.test then found its gathered weights
            # on the CPU beside CUDA inputs (two H200s, 2026-11-22). The partitions stay where they are.
            module.to(self.root_device)
        config: dict[str, Any] = {
            key: self.config[key] for key in ("fp16", "bf16", "zero_optimization") if key in self.config
        }
        if not self.zero_stage_3:
            config.pop("zero_optimization", None)  # nothing to partition without an optimizer
        config["train_micro_batch_size_per_gpu"] = self.config.get("train_micro_batch_size_per_gpu", 1)
        config.update(extra)
        with explained_parameter_buffers():
            engine, _, _, _ = deepspeed.initialize(
                config=config, model=module, model_parameters=[], dist_init_required=False
            )
        return engine

    # -- model creation ----------------------------------------------------------------------

    def _refuse_eager_init_under_zero_3(self: _ParallelStrategy, empty_init: bool | None) -> None:
        if self.zero_stage_3 and empty_init is False:
            raise NotImplementedError(
                "`empty_init=False` is not a valid choice with `DeepSpeedStrategy` when ZeRO stage 3 is enabled. "
                "ZeRO stage 3 creates the parameters partitioned: leave empty_init unset, or use stage 2 to create "
                "the whole model in every process."
            )

    def _finish_partitioned_models(self: _ParallelStrategy, module: torch.nn.Module) -> None:
        """The ``transformers`` models built partitioned get Hugging Face's initialisation and their pretrained
        weights, before the engine takes them (``partitioned_models``); compiled modules are warned of."""
        if self.zero_stage_3:
            deepspeed = import_deepspeed(self.root_device.type)
            finish_partitioned_models(module, deepspeed, self.global_rank, self.root_device)
            warn_compiled_modules(module)

    @contextmanager
    def _partitioned_init(self: _ParallelStrategy, config: dict[str, Any]) -> Iterator[None]:
        """ZeRO-3's context in which parameters are created partitioned across the ranks."""
        deepspeed = import_deepspeed(self.root_device.type)
        with (
            explained_parameter_buffers(),
            deepspeed.zero.Init(remote_device=self.remote_device, config_dict_or_path=config),
        ):
            yield

    # -- checkpoints -------------------------------------------------------------------------

    def _save_engine(self: _ParallelStrategy, engine: Any, path: Any, client_state: dict[str, Any]) -> None:
        """One DeepSpeed checkpoint directory at ``path``, ``client_state`` inside.

        Every rank writes into a hidden staging directory, published under ``path`` in one rename once all
        are done: a save killed half way leaves the previous checkpoint whole.
        """
        path = self.broadcast(str(path))
        with staged_save(path, self.is_global_zero, self.barrier) as staged:
            checkpoints.save(engine, staged, client_state, self.exclude_frozen_parameters)

    def _load_whole_weights(
        self: _ParallelStrategy, module: torch.nn.Module, optimizer: Any, weights: dict[str, Any], strict: bool
    ) -> None:
        """Whole (unpartitioned) weights into ``module``, then into the fp32 master copies ``optimizer`` keeps, or
        its next step would undo the load."""
        if self.zero_stage_3:
            checkpoints.load_into_partitioned_module(module, weights, strict, self.is_global_zero)
        else:
            module.load_state_dict(weights, strict=strict)
        refresh_fp32_params = getattr(optimizer, "refresh_fp32_params", None)
        if refresh_fp32_params is not None:
            refresh_fp32_params()

    def _recover_checkpoint(self: _ParallelStrategy, path: Any) -> str:
        """Finish or undo a save interrupted at ``path``; returns rank 0's path, the same on every rank."""
        if self.is_global_zero:
            recover(path)  # the broadcast below holds the other ranks until this is done
        return str(self.broadcast(str(path)))

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """The names are registered by the lightning-strategies plugin (plugin.py)."""


def check_full_weights_path(path: str) -> None:
    """A local full-weights file is checked before loading, for an error that names the problem and the fix."""
    if _is_local_file_protocol(path):
        checkpoints.check_full_weights_file(Path(path))


@contextmanager
def explained_parameter_buffers() -> Iterator[None]:
    """DeepSpeed swaps each process's partition of a parameter offloaded to NVMe through one pinned buffer and asserts
    that it fits, with a bare ``AssertionError`` deep in model construction or engine set-up (on one process, a Llama-3
    1B embedding of 262,668,288 elements met the default buffer of 100,000,000). Said here with the parameter that
    sets it."""
    try:
        yield
    except AssertionError as error:
        found = re.fullmatch(r"More elements (\d+) than buffer size (\d+)", str(error))
        if found is None:
            raise
        elements, size = (int(number) for number in found.groups())
        raise ValueError(
            f"A parameter's partition of {elements:,} elements does not fit DeepSpeed's NVMe parameter buffers of "
            f"{size:,} elements: each process's share of an offloaded parameter (all of it, on one process) passes "
            "whole through one of them. Make them at least as large: "
            f"DeepSpeedStrategy(..., params_buffer_size={elements}) (offload_param.buffer_size in a config=). Each of "
            "the params_buffer_count buffers is pinned host memory of that many elements."
        ) from error
