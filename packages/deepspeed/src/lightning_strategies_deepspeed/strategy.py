"""DeepSpeed for the Lightning Trainer, on CUDA GPUs and on CPU (gloo), DeepSpeed 0.16-0.19.

Built on DDPStrategy rather than Lightning's DeepSpeedStrategy: that class imports deepspeed in
its constructor, before the Trainer has chosen the device, so DeepSpeed would pick CUDA on a GPU
host even for ``accelerator="cpu"``; it also refuses CPU outright. It is registered as a virtual
subclass of Lightning's class instead (end of this module), so every ``isinstance`` check Lightning
makes for its DeepSpeed strategy treats this one the same (docs/lightning-compatibility.md). What it
shares with the Fabric strategy lives in ``body.py``; this module adds what the Trainer asks for.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.deepspeed import DeepSpeedStrategy as LightningDeepSpeedStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from lightning.pytorch.utilities.types import LRSchedulerConfig
from typing_extensions import override

from lightning_strategies import CheckpointError, MissingBackendError, constructor_for
from lightning_strategies.checkpoints import on_rank_zero, one_file_for, remove
from lightning_strategies.hugging_face import deferred_pretrained_loading, record_models
from lightning_strategies.precision import OwnPrecisionMixin, fp16_mixed_on_cpu_as_bf16
from lightning_strategies.ranks import ReportFailuresMixin
from lightning_strategies_deepspeed import checkpoint as checkpoints
from lightning_strategies_deepspeed import compatibility, foreign, universal
from lightning_strategies_deepspeed import config as settings
from lightning_strategies_deepspeed.backend import import_deepspeed
from lightning_strategies_deepspeed.body import DeepSpeedBody, check_full_weights_path
from lightning_strategies_deepspeed.precision import DeepSpeedPrecision

log = logging.getLogger(__name__)


class DeepSpeedStrategy(DeepSpeedBody, OwnPrecisionMixin, ReportFailuresMixin, DDPStrategy):
    """ZeRO stages 0-3 with CPU/NVMe offload; the parameters are those of Lightning's DeepSpeedStrategy.

    ``config`` (a dict or a JSON file) replaces the config built from the other parameters; any
    DeepSpeed option can be passed that way (ZeRO++ and other 0.17+ settings included).
    """

    strategy_name = "deepspeed"

    # The body's constructor under this class's name (Python's errors for a wrong call name it), with precision
    # named as Lightning's Trainer strategies take it.
    __init__ = constructor_for(__qualname__, DeepSpeedBody.__init__, precision="precision_plugin")
    precision_keyword = "precision_plugin"
    _full_weights_pending = False

    # -- precision ---------------------------------------------------------------------------

    @override
    def own_precision_plugin(self, precision: str) -> DeepSpeedPrecision:
        return DeepSpeedPrecision(fp16_mixed_on_cpu_as_bf16(precision, isinstance(self.accelerator, CPUAccelerator)))

    @property
    def deepspeed_engine(self) -> Any:
        return self.model

    @property
    @override
    def handles_gradient_accumulation(self) -> bool:
        # Lightning marks the window; the precision plugin tells the engine where it ends.
        return False

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # the engine must exist to load its shards

    @property
    @override
    def lightning_restore_optimizer(self) -> bool:
        return False  # the engine restores its (partitioned) optimizer state itself

    # -- start-up ----------------------------------------------------------------------------

    @override
    def setup_distributed(self) -> None:
        self._check_devices()
        super().setup_distributed()
        self._attach_deepspeed()

    @override
    def setup(self, trainer: Any) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self._check_nvme_path()
        self._complete_trainer_config(trainer)
        model = self.precision_plugin.convert_module(self.model)
        self._finish_partitioned_models(model)
        if trainer.state.fn == TrainerFn.FITTING:
            self._initialize_for_training(model)
        else:
            self._initialize_for_evaluation(model)
        self.setup_precision_plugin()
        self.barrier()

    def _check_nvme_path(self) -> None:
        if not settings.uses_nvme(self.parameters) or self.config is None:
            return
        path = Path(self.parameters["nvme_path"])
        if not (path.is_dir() and os.access(path, os.W_OK)):
            raise FileNotFoundError(
                f"DeepSpeedStrategy(nvme_path={str(path)!r}) must be a writable directory (on fast local storage) "
                "for NVMe offloading. Create it, or pass nvme_path= pointing at one."
            )
        from deepspeed.ops.op_builder import AsyncIOBuilder

        # Without libaio DeepSpeed fails deep inside engine set-up ("Unable to JIT load the async_io
        # op ... None"); seen on an H200 image that lacks libaio-dev.
        if not AsyncIOBuilder().is_compatible(verbose=False):
            raise MissingBackendError(
                "NVMe offload needs DeepSpeed's async_io op, which builds against libaio, and libaio was not "
                "found. Install it (Debian/Ubuntu: apt-get install libaio-dev; RHEL: yum install libaio-devel), "
                "or offload to CPU instead (offload_optimizer_device='cpu', offload_params_device='cpu')."
            )

    def _complete_trainer_config(self, trainer: Any) -> None:
        """Add what only the Trainer knows: precision, batch size, accumulation, clipping."""
        if self._config_completed:
            return
        accumulation = self._complete_config(
            self.precision_plugin.precision,
            trainer.accumulate_grad_batches,
            self._micro_batch_size(trainer),
            trainer.gradient_clip_val,
            _algorithm_name(trainer.gradient_clip_algorithm),
        )
        if accumulation != trainer.accumulate_grad_batches:
            rank_zero_info(f"Accumulating gradients over {accumulation} batches, as the DeepSpeed config says.")
            trainer.accumulate_grad_batches = accumulation

    def _micro_batch_size(self, trainer: Any) -> int:
        """Only DeepSpeed's throughput logs read it: the train loader's batch size, else 1."""
        source = trainer.fit_loop._data_source
        if source.is_defined():
            try:
                batch_size = getattr(source.dataloader(), "batch_size", None)
            except Exception:  # a loader that cannot be built here is built again by the loop
                batch_size = None
            if isinstance(batch_size, int) and batch_size > 0:
                return batch_size
        return 1

    def _initialize_for_training(self, model: torch.nn.Module) -> None:
        optimizer = None
        scheduler_configs: list[LRSchedulerConfig] = []
        if "optimizer" not in self.config:
            assert self.lightning_module is not None
            optimizers, scheduler_configs = _init_optimizers_and_lr_schedulers(self.lightning_module)
            if len(optimizers) != 1 or len(scheduler_configs) > 1:
                raise settings.DeepSpeedConfigurationError(
                    "DeepSpeed currently only supports single optimizer, single optional scheduler. "
                    f"configure_optimizers returned {len(optimizers)} optimizers and {len(scheduler_configs)} "
                    "schedulers: return one optimizer, and at most one scheduler."
                )
            optimizer = optimizers[0]
        engine, deepspeed_optimizer, _, _ = self._initialize_engine(model, optimizer)
        if engine.lr_scheduler is not None:
            # A scheduler from the config: Lightning steps it once per optimizer step, not DeepSpeed.
            scheduler_configs = [LRSchedulerConfig(engine.lr_scheduler, interval="step")]
            engine.lr_scheduler = None
        self._configure_activation_checkpointing()
        self.model = engine
        self.optimizers = [deepspeed_optimizer]
        self.lr_scheduler_configs = scheduler_configs

    def _initialize_for_evaluation(self, model: torch.nn.Module) -> None:
        engine = self._initialize_evaluation_engine(model, zero_allow_untested_optimizer=True)
        self._configure_activation_checkpointing()
        self.model = engine

    def _configure_activation_checkpointing(self) -> None:
        checkpointing = self.config.get("activation_checkpointing")
        if not checkpointing:
            return
        deepspeed = import_deepspeed(self.root_device.type)
        deepspeed.checkpointing.configure(
            mpu_=None,
            partition_activations=checkpointing.get("partition_activations"),
            contiguous_checkpointing=checkpointing.get("contiguous_memory_optimization"),
            num_checkpoints=checkpointing.get("number_checkpoints"),
            checkpoint_in_cpu=checkpointing.get("cpu_checkpointing"),
            synchronize=checkpointing.get("synchronize_checkpoint_boundary"),
            profile=checkpointing.get("profile"),
        )

    @override
    def setup_optimizers(self, trainer: Any) -> None:
        """The optimizer is built with the engine in ``setup``."""
        self.optimizers = []
        self.lr_scheduler_configs = []

    @override
    def model_to_device(self) -> None:
        if self.model is not None and not self.zero_stage_3:
            self.model.to(self.root_device)

    @override
    def pre_backward(self, closure_loss: torch.Tensor) -> None:
        """No DistributedDataParallel to prepare: the engine reduces gradients."""

    @contextmanager
    @override
    def block_backward_sync(self) -> Generator[None, None, None]:
        yield  # the engine skips reduction off the accumulation boundary

    # -- model creation ----------------------------------------------------------------------

    @contextmanager
    @override
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        self._refuse_eager_init_under_zero_3(empty_init)
        if self.zero_stage_3:
            yield
            return
        with super().tensor_init_context(empty_init=empty_init):
            yield

    @contextmanager
    @override
    def model_sharded_context(self) -> Generator[None, None, None]:
        """Parameters created here (in ``configure_model``) are partitioned at once under ZeRO stage 3."""
        if not self.zero_stage_3:
            yield
            return
        with (
            deferred_pretrained_loading(self.strategy_name, initialize_later=True),
            self._partitioned_init(self._init_config()),
        ):
            yield

    def _init_config(self) -> dict[str, Any]:
        # zero.Init runs before setup(); it needs the precision and a batch size DeepSpeed accepts.
        config = dict(self.config)
        settings.add_precision(config, self.precision_plugin.precision, self.parameters)
        config.setdefault("train_micro_batch_size_per_gpu", 1)
        config.pop("train_batch_size", None)
        config.pop("gradient_accumulation_steps", None)
        return config

    # -- checkpoints -------------------------------------------------------------------------

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}  # the engine writes the (partitioned) weights itself

    @override
    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return {}  # the engine writes the (partitioned) optimizer state itself

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Write a DeepSpeed checkpoint directory at ``filepath``: one shard per rank, Lightning's state inside."""
        if storage_options is not None:
            raise TypeError(
                "`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg is not supported for "
                f"`{type(self).__name__}` as `CheckpointIO` is not used. DeepSpeed writes the files itself."
            )
        record_models(checkpoint, self.lightning_module)
        client_state = {
            key: value for key, value in checkpoint.items() if key not in ("state_dict", "optimizer_states")
        }
        self._save_engine(self.model, filepath, client_state)

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero:
            remove(filepath)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint_path = self._recover_checkpoint(checkpoint_path)
        if self.load_full_weights:
            return self._load_full_weights_file(checkpoint_path, weights_only)
        # Decided by rank 0 for all: a node that does not see the path takes the same load as the others, where every
        # rank is told that it does not see what rank 0 converts (check_seen), instead of taking another load alone.
        if self.lightning_module is not None and on_rank_zero(self, lambda: foreign.is_foreign(checkpoint_path)):
            return self._load_foreign(checkpoint_path, weights_only)
        location, layout = checkpoints.inspect(checkpoint_path, weights_only)
        assert self.lightning_module is not None and self.model is not None
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        if not fitting and not location.universal and (self.zero_stage_3 or layout.parameter_ranks):
            # The evaluation engine has no ZeRO optimizer for DeepSpeed to load ZeRO-3 shards into (its
            # loader then fails on DeepSpeedZeRoOffload), and no partitioned parameters for a ZeRO-3
            # checkpoint to go to: merge the shards and load the full weights instead.
            self._full_weights_pending = True
            return checkpoints.convert_zero_checkpoint(location.tag_folder, weights_only=weights_only)
        if checkpoints.saved_with_the_other_zero(location, layout, self.zero_stage_3):
            return self._load_foreign(checkpoint_path, weights_only)
        restores_optimizer = fitting and self.model.optimizer is not None
        with universal.resume_anywhere(self, location, layout, restores_optimizer, weights_only) as (location, layout):
            return self._load_into_engine(location, layout, restores_optimizer, weights_only)

    def _load_into_engine(
        self,
        location: checkpoints.CheckpointLocation,
        layout: compatibility.SavedLayout,
        load_optimizer_states: bool,
        weights_only: bool | None,
    ) -> dict[str, Any]:
        assert self.lightning_module is not None and self.model is not None
        return checkpoints.load_into_engine(
            self.model,
            location,
            layout,
            self.world_size,
            load_optimizer_states=load_optimizer_states,
            weights_only=weights_only,
            strict=self.lightning_module.strict_loading,
        )

    def _load_foreign(self, path: Any, weights_only: bool | None) -> dict[str, Any]:
        """Another strategy's checkpoint (``foreign``): its weights and optimizer states when fitting with an
        optimizer, through DeepSpeed's universal layout; else its weights alone, from its one-file form."""
        assert self.lightning_module is not None and self.model is not None
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        if not (fitting and self.model.optimizer is not None):
            checkpoint = self._load_full_weights_file(one_file_for(path, self, weights_only), weights_only)
            self._full_weights_pending = True
            return checkpoint

        def check(full: Path) -> None:
            if not foreign.holds_optimizer_states(full, weights_only):
                # Lightning leaves restoring the optimizer to this strategy (lightning_restore_optimizer is False),
                # so its own refusal of a fit from weights alone never comes: the optimizer would start afresh unsaid.
                raise CheckpointError(
                    f"Trying to restore optimizer state but checkpoint contains only the model: {path} holds no "
                    "optimizer states, so the optimizer would start afresh. To agree, resume with DeepSpeedStrategy("
                    "load_full_weights=True) (the weights, schedulers and loops resume); to go on with the saved "
                    "run's optimizer, resume from a checkpoint saved with it."
                )

        with foreign.universal_form(self, path, weights_only, check) as target:
            location, layout = checkpoints.inspect(target, weights_only)
            return self._load_into_engine(location, layout, True, weights_only)

    def _load_full_weights_file(self, path: str, weights_only: bool | None) -> dict[str, Any]:
        check_full_weights_path(path)
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        if "state_dict" not in checkpoint:
            raise CheckpointError(
                f"{path} has no 'state_dict' entry, so it is not a Lightning checkpoint. Save a model's weights for "
                "load_full_weights=True as torch.save({'state_dict': model.state_dict()}, path)."
            )
        assert self.lightning_module is not None
        if self.lightning_module.trainer.state.fn == TrainerFn.FITTING:
            _refuse_dropping_optimizer_states(path, checkpoint)
        return checkpoint

    @override
    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        if not (self.load_full_weights or self._full_weights_pending):
            return  # the engine already loaded its shards in load_checkpoint
        self._full_weights_pending = False
        assert self.lightning_module is not None
        optimizer = getattr(self.model, "optimizer", None)
        self._load_whole_weights(self.lightning_module, optimizer, checkpoint["state_dict"], strict)

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """The engine restored the optimizer state in load_checkpoint."""


# Lightning's callbacks, loops and connector check for its DeepSpeed strategy by class: the model summary of
# ZeRO-3, the refusals of StochasticWeightAveraging, BaseFinetuning, GradientAccumulationScheduler and compiled
# models, the precision plugin. ABC registration makes isinstance() true without inheriting its constructor.
LightningDeepSpeedStrategy.register(DeepSpeedStrategy)


def _refuse_dropping_optimizer_states(path: str, checkpoint: Mapping[str, Any]) -> None:
    """A resume from one file (load_full_weights=True) restores the weights, schedulers and loops, but DeepSpeed
    builds its (partitioned) optimizer state afresh: a file that holds optimizer states (ddp's, fsdp's full file) would
    resume with them dropped, Adam's moments and step counts restarted, and the losses leave the uninterrupted
    run's (measured: issue 29 item 2). Refused unless the user agreed by loading a file without them."""
    saved = [state for state in checkpoint.get("optimizer_states") or [] if isinstance(state, Mapping)]
    held = [state.get("state") or {} for state in saved]
    if not any(held):
        return
    kinds = sorted({name for states in held for state in states.values() for name in state})
    raise CheckpointError(
        f"{path} holds the state of {len(saved)} optimizer(s) for {sum(len(states) for states in held)} parameters "
        f"({', '.join(kinds)}), which DeepSpeedStrategy(load_full_weights=True) cannot load from one file: resuming "
        "here would drop them (the optimizer would start afresh, its moments and step counts at zero) while the "
        "weights, learning-rate schedulers and loops resume. To keep them under DeepSpeed, convert the file to "
        f"DeepSpeed's universal layout (`lightning-strategies convert {path} zero.ckpt --to deepspeed`) and resume "
        "from zero.ckpt without load_full_weights. Or resume this file with a strategy that carries them "
        '(strategy="ddp" or "fsdp"), or agree to drop them by resuming from a copy without them: '
        f"`python -c \"import torch; c = torch.load('{path}'); del c['optimizer_states']; "
        "torch.save(c, 'weights.ckpt')\"`, then ckpt_path='weights.ckpt'."
    )


def _algorithm_name(algorithm: Any) -> str | None:
    return None if algorithm is None else str(getattr(algorithm, "value", algorithm))
