"""``Trainer(strategy="fsdp")`` on FSDP2: ``fully_shard`` with DCP checkpoints, on CPU (gloo) and GPU.

Lightning 2.6's own FSDPStrategy drives FSDP1 and refuses CPU. This strategy accepts the same
constructor arguments (see ``options``), shards the LightningModule in ``setup`` after
``configure_model``, and checkpoints through DCP so a checkpoint loads onto any number of
processes. It is registered as a virtual subclass of Lightning's FSDPStrategy (end of this module), so
every ``isinstance`` check Lightning makes for its FSDP strategy treats this one the same
(docs/lightning-compatibility.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies.fsdp import FSDPStrategy as LightningFSDPStrategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_strategies import constructor_for
from lightning_strategies.checkpoints import one_file_for, reads_torch_save_files, remove
from lightning_strategies.hugging_face import record_models
from lightning_strategies.precision import OwnPrecisionMixin, fp16_mixed_on_cpu_as_bf16
from lightning_strategies.ranks import ReportFailuresMixin
from lightning_strategies_fsdp import checkpoint as checkpoints
from lightning_strategies_fsdp.body import FSDP2Body, gradient_sync_paused
from lightning_strategies_fsdp.checkpoint_layout import DCP
from lightning_strategies_fsdp.float8 import (
    WRAPPER_MARK,
    drop_float8_scales_after_steps,
    unwrap_method,
)
from lightning_strategies_fsdp.options import STRATEGY
from lightning_strategies_fsdp.precision import (
    FSDP2BF16MixedPrecision,
    FSDP2HalfPrecision,
    FSDP2MixedPrecision,
    FSDP2Precision,
)
from lightning_strategies_fsdp.sharding import scale_float8_weights

# LightningModule methods the Trainer calls instead of forward: FSDP2 must all-gather around them.
STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


class FSDP2Strategy(FSDP2Body, OwnPrecisionMixin, ReportFailuresMixin, ParallelStrategy):
    """Fully Sharded Data Parallel on ``torch.distributed.fsdp.fully_shard`` (FSDP2).

    Accepts Lightning's FSDPStrategy arguments. ``sharding_strategy`` picks the mesh and
    resharding: FULL_SHARD (shard, reshard after forward), SHARD_GRAD_OP (keep parameters
    gathered until backward), NO_SHARD (replicate), HYBRID_SHARD (replicate across nodes, shard
    within; ``device_mesh=(replicas, shard size)`` overrides the layout). ``auto_wrap_policy``
    (a set of block classes, a ``torch.distributed.fsdp.wrap`` policy or an FSDP1-style callable)
    picks the modules sharded as their own group; by default, repeated blocks of a ModuleList or
    Sequential. ``state_dict_type`` "sharded" saves a DCP folder, "full" a single file; either loads.
    """

    strategy_name = "fsdp"
    launcher_class = _SubprocessScriptLauncher

    # The body's constructor under this class's name (Python's errors for a wrong call name it), with precision
    # named as Lightning's Trainer strategies take it.
    __init__ = constructor_for(__qualname__, FSDP2Body.__init__, precision="precision_plugin")
    precision_keyword = "precision_plugin"

    @override
    def _precision_flag(self) -> str:
        return str(self.precision_plugin.precision)

    @override
    def own_precision_plugin(self, precision: str) -> Any:
        """The plugin for a flag. Lightning's connector hands this strategy, as one of its FSDP strategies, an FSDP1
        ``FSDPPrecision`` (whose gradient clipping by norm refuses to run); the plugins its generic path builds
        serve FSDP2."""
        device = "cpu" if isinstance(self.accelerator, CPUAccelerator) else "cuda"
        precision = fp16_mixed_on_cpu_as_bf16(precision, device == "cpu")
        if precision == "bf16-mixed":
            return FSDP2BF16MixedPrecision(device)
        if precision == "16-mixed":
            return FSDP2MixedPrecision("16-mixed", device)
        if precision in ("16-true", "bf16-true"):
            return FSDP2HalfPrecision(precision)  # type: ignore[arg-type]
        if precision == "32-true":
            return FSDP2Precision()
        return None  # a flag FSDP2 has no plugin of its own for: Lightning's

    @property
    def is_distributed(self) -> bool:
        return True

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        # Checkpoints load into the sharded model, so no process ever holds the whole model.
        return True

    @property
    @override
    def lightning_restore_optimizer(self) -> bool:
        return False  # load_checkpoint restores the optimizers, sharded

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self.connect_processes()
        assert self.lightning_module is not None
        self.lightning_module._device_mesh = self._device_mesh  # readable in configure_model

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        assert self.accelerator is not None
        assert self.model is not None
        self.accelerator.setup(trainer)
        if any(isinstance(module, FullyShardedDataParallel) for module in self.model.modules()):
            raise TypeError(
                f"{STRATEGY} runs FSDP2 (fully_shard) and found modules wrapped in FSDP1's FullyShardedDataParallel. "
                "Remove that wrapping (or call torch.distributed.fsdp.fully_shard in configure_model instead)."
            )
        self.model = self.precision_plugin.convert_module(self.model)
        self._shard(self.model)
        for method in STEP_METHODS:
            _register_step_method(self.model, method)
        scale_float8_weights(self.model, self.options, STEP_METHODS)
        self.barrier()

        if trainer.state.fn == TrainerFn.FITTING:
            # Optimizers built before sharding would hold the replaced parameters: build them now.
            self._reset_optimizers_and_schedulers()
            self.setup_optimizers(trainer)
            for optimizer in self.optimizers:
                drop_float8_scales_after_steps(optimizer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING and not self._offloaded:
            _optimizers_to_device(self.optimizers, self.root_device)

    @property
    def _offloaded(self) -> bool:
        from torch.distributed.fsdp import CPUOffloadPolicy

        return isinstance(self.options.offload_policy, CPUOffloadPolicy)

    @override
    def model_to_device(self) -> None:
        pass  # fully_shard places each shard (on the accelerator, or in host memory when offloading)

    @contextmanager
    @override
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        with self._init_context(empty_init, self.precision_plugin.tensor_init_context()):
            yield

    @contextmanager
    @override
    def model_sharded_context(self) -> Generator[None, None, None]:
        """``configure_model`` (and ``configure_sharded_model``) build on the meta device: no process holds the
        whole model, and ``setup`` allocates each shard where it trains, initialized or read from the files."""
        with self._deferred_init():
            yield

    @contextmanager
    @override
    def block_backward_sync(self) -> Generator[None, None, None]:
        assert self.model is not None
        with gradient_sync_paused(self.model):
            yield

    @override
    def reduce(self, tensor: Tensor | Any, group: Any | None = None, reduce_op: Any = "mean") -> Tensor:
        return self._reduce(tensor, group, reduce_op)

    @override
    def teardown(self) -> None:
        assert self.cluster_environment is not None
        assert self.accelerator is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        self.accelerator.teardown()

    # Checkpoints -------------------------------------------------------------------------------

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        assert self.model is not None
        return checkpoints.model_state(self.model, full=self._full_state)

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        assert self.model is not None
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        return checkpoints.optimizer_state(self.model, optimizer, full=self._full_state)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        self._refuse_storage_options(storage_options)
        path = self._agreed_path(filepath)
        record_models(checkpoint, self.lightning_module)
        if self._full_state:
            self._save_full(path, checkpoint, storage_options)
            return
        tensors = {"state_dict": checkpoint.pop("state_dict")}
        for index, state in enumerate(checkpoint.pop(checkpoints.TRAINER_OPTIMIZERS, [])):
            tensors[f"optimizer_{index}"] = state
        self._save_sharded(path, tensors, checkpoint)

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        if not self.is_global_zero:
            return
        if Path(filepath).is_file() and not reads_torch_save_files(self.checkpoint_io):
            self.checkpoint_io.remove_checkpoint(filepath)  # the user's CheckpointIO wrote it, and may keep more
        else:
            remove(filepath)  # a kill half way through never leaves a partial checkpoint under the name

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        assert self.model is not None
        assert self.lightning_module is not None
        # Another strategy's folder that its package writes into one file with everything (DeepSpeed's ZeRO
        # folders) resumes from that file, written once inside it by rank 0.
        path = Path(one_file_for(self._path_to_load(checkpoint_path), self, weights_only, native=(DCP.key,)))
        # Optimizers resume only when fitting; validate/test/predict load the weights (as Lightning's FSDPStrategy).
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        optimizers = {f"optimizer_{index}": optimizer for index, optimizer in enumerate(self.optimizers)}
        loaded = checkpoints.load_into(
            path,
            self.model,
            "state_dict",
            optimizers if fitting else {},
            strict=self.lightning_module.strict_loading,
            weights_only=weights_only,
            all_optimizers=fitting,
            read_full=checkpoints.checkpoint_io_reader(self.checkpoint_io, weights_only),
        )
        return checkpoints.join_trainer_optimizers(loaded)

    @override
    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        pass  # load_checkpoint loaded the weights into the sharded model already

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        pass  # load_checkpoint loaded the optimizer states already


def _register_step_method(module: torch.nn.Module, method: str) -> None:
    """Make FSDP2 all-gather around a step method as around forward, keeping the method's signature
    (Lightning inspects it, for example for ``dataloader_idx``)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    original = getattr(type(module), method, None)
    if original is None:
        return
    # Set-up runs again for every trainer call on the same model: wrap what the model has, not the last wrappers.
    unwrap_method(module, method)
    replaced = module.__dict__.get(method)
    register_fsdp_forward_method(module, method)
    wrapper = getattr(getattr(module, method), "__func__", None)
    if wrapper is not None:
        wrapper.__signature__ = inspect.signature(original)
        setattr(wrapper, WRAPPER_MARK, (replaced,))


# Lightning's loops, callbacks and connector check for its FSDP strategy by class: validation, test and predict
# under no_grad (FSDP's unshard records tensor versions, which inference tensors lack), the refusals of
# StochasticWeightAveraging and ServableModuleValidator, torch.compile's support, the precision plugin. ABC
# registration makes isinstance() true without inheriting FSDP1's constructor and methods.
LightningFSDPStrategy.register(FSDP2Strategy)
