"""ColossalAIStrategy: ColossalAI 0.5 Gemini (GeminiDDP + GeminiOptimizer) under Lightning's own
launcher and process group, with the parameters of the Lightning 1.x ColossalAIStrategy.

The hooks Lightning calls say when; how is in a module per concern (refusals, lazy_init, gemini_setup,
memory, checkpoint_state for full checkpoints, sharded_checkpoint), so each of Gemini's quirks is in one place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning_utilities.core.apply_func import apply_to_collection
from typing_extensions import override

from lightning_strategies.checkpoints import (
    check_checkpoint_file,
    check_trainer_checkpoint,
    is_local,
    one_file_for,
    recover_before_load,
    remove_checkpoint_path,
    staged_save,
    weights_only_keyword,
)
from lightning_strategies.checkpoints import staged_checkpoint_io_save as staged_checkpoint
from lightning_strategies.hugging_face import record_models
from lightning_strategies.precision import OwnPrecisionMixin
from lightning_strategies.ranks import ReportFailuresMixin, watch_ranks
from lightning_strategies_colossalai import checkpoint_state, gemini_setup, lazy_init, refusals, statistics
from lightning_strategies_colossalai import sharded_checkpoint as sharded
from lightning_strategies_colossalai.backend import load_colossalai, undo_import_changes
from lightning_strategies_colossalai.checkpoint_layout import COLOSSALAI
from lightning_strategies_colossalai.kernels import announce_kernel_build
from lightning_strategies_colossalai.optimizer_positions import for_gemini
from lightning_strategies_colossalai.options import MEBI, GeminiSettings, Placement, StateDictType
from lightning_strategies_colossalai.precision import GeminiPrecision


class ColossalAIStrategy(OwnPrecisionMixin, ReportFailuresMixin, DDPStrategy):
    """ColossalAI Gemini: chunk-based ZeRO with parameters and optimizer states placed on GPU or CPU.

    Build the model in ``LightningModule.configure_model`` so it is created lazily and sharded into
    chunks as it is materialised. The one optimizer must be ``colossalai.nn.optimizer.HybridAdam``
    or ``CPUAdam``. Trains with ``precision="16-mixed"`` or ``"bf16-mixed"`` on CUDA GPUs.
    """

    strategy_name = "colossalai"

    def __init__(
        self,
        use_chunk: bool = True,
        chunk_size: int | None = None,
        enable_distributed_storage: bool = True,
        placement_policy: Placement = "auto",
        force_outputs_fp32: bool = False,
        gpu_margin_mem_ratio: float = 0.0,
        chunk_search_range: int = 64 * MEBI,
        chunk_search_n_grids: int = 4096,
        min_chunk_size: int = 32 * MEBI,
        initial_scale: float = 2**16,
        min_scale: float = 1,
        growth_factor: float = 2,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
        max_scale: float = 2**32,
        state_dict_type: StateDictType = "full",
        shard_size_mb: int = 1024,
        offload_optim_frac: float | None = None,
        offload_param_frac: float | None = None,
        pin_memory: bool | None = None,
        max_prefetch: int = 0,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        """Configure Gemini; every parameter of the Lightning 1.x ColossalAIStrategy is accepted.

        Args:
            use_chunk: Kept for compatibility. ColossalAI 0.5 always manages parameters in chunks;
                ``False`` is accepted with a warning and has no effect.
            chunk_size: Chunk size in parameters (elements). ``None`` searches the size with the
                ``chunk_search_range``, ``chunk_search_n_grids`` and ``min_chunk_size`` bounds.
            enable_distributed_storage: Shard chunks across ranks (memory 1/N). ``False`` keeps every
                parameter replicated on each rank (GeminiDDP ``strict_ddp_mode``, no parameter sharding).
            placement_policy: ``"cuda"``: chunks and optimizer states stay on the GPU (GeminiPlugin
                static placement, no offload; fastest). ``"cpu"``: parameters and optimizer states are
                offloaded to CPU memory (static placement, full offload; least GPU memory). ``"auto"``:
                Gemini traces memory in the first training step and moves chunks between GPU and CPU.
                ``"static"``: offloads the share ``offload_optim_frac`` (``offload_param_frac=1``: 16-bit chunks too).
            force_outputs_fp32: Cast the model's outputs to fp32.
            gpu_margin_mem_ratio: Share (0 to 1) of the GPU memory left free after the first step that
                the optimizer may use for fp32 master weights and states. Used only with placement "auto".
            chunk_search_range: Width of the chunk size search, in parameters; searched from the largest
                parameter (at least ``min_chunk_size``) upwards.
            chunk_search_n_grids: Number of steps the search range is divided into.
            min_chunk_size: Smallest chunk, in parameters; a model smaller than this is one chunk kept whole.
            initial_scale: Initial dynamic loss scale (fp16 only).
            min_scale: Lowest dynamic loss scale (fp16 only).
            growth_factor: Factor the loss scale grows by after ``growth_interval`` steps without overflow.
            backoff_factor: Factor the loss scale shrinks by after ``hysteresis`` overflows.
            growth_interval: Overflow-free steps before the loss scale grows.
            hysteresis: Overflows tolerated before the loss scale shrinks.
            max_scale: Highest dynamic loss scale (fp16 only).
            state_dict_type: ``"full"``: one checkpoint file written by rank 0 with the gathered model and
                optimizer state. ``"sharded"``: a checkpoint folder of size-bounded shard files written
                without holding the whole state at once (ColossalAI's index format, loadable on any
                number of GPUs).
            shard_size_mb: Largest shard file, in MiB, for ``state_dict_type="sharded"``.
            offload_optim_frac: With placement "static": the share (0 to 1) of fp32 master weights and optimizer
                states kept and updated on the CPU; ``lightning-strategies plan`` picks the least that fits.
            offload_param_frac: With placement "static" and ``offload_optim_frac=1``: 1 offloads the 16-bit chunks.
            pin_memory: Pinned host copies of every chunk and asynchronous reduction (ColossalAI's default); by
                default only with placement "cpu".
            max_prefetch: Chunks gathered ahead of the operation that needs them (GeminiDDP's ``max_prefetch``),
                so that gathering overlaps computation on several GPUs; 0 gathers each chunk when it is needed.
            accelerator: The accelerator; must be CUDA.
            parallel_devices: The devices to train on (set by the Trainer).
            cluster_environment: The cluster environment (set by the Trainer).
            checkpoint_io: Checkpoint IO plugin for full checkpoints.
            precision_plugin: Precision plugin; defaults to Gemini's own for the Trainer's precision.
            process_group_backend: Process group backend; defaults to NCCL.
            timeout: Timeout of collective operations.
        """
        # Each GeminiSettings field is the parameter of the same name; the settings validate them together.
        arguments = locals()
        self.settings = GeminiSettings(**{name: arguments[name] for name in GeminiSettings.__dataclass_fields__})
        self.settings.warn_obsolete()
        if not isinstance(shard_size_mb, int) or shard_size_mb <= 0:
            raise ValueError(f"ColossalAIStrategy(shard_size_mb={shard_size_mb!r}) must be a positive integer.")
        self.shard_size_mb = shard_size_mb
        super().__init__(
            accelerator=accelerator, parallel_devices=parallel_devices, cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io, precision_plugin=precision_plugin,
            process_group_backend=process_group_backend, timeout=timeout,
        )  # fmt: skip
        self._gemini_plugin: Any = None
        self._gemini_model: Any = None

    # ----------------------------------------------------------------------------------- checks

    @override
    def own_precision_plugin(self, precision: str) -> GeminiPrecision:
        plugin = GeminiPrecision(precision)
        self.settings.warn_precision(precision)
        return plugin

    def check_accelerator(self) -> None:
        """Refuse anything but CUDA, before processes are launched or colossalai is imported."""
        refusals.check_accelerator(self.accelerator, self.settings.placement_policy)

    @override
    def _configure_launcher(self) -> None:
        self.check_accelerator()
        super()._configure_launcher()

    check_optimizers = staticmethod(refusals.check_optimizers)
    refuse_weight_averaging = staticmethod(refusals.refuse_weight_averaging)

    def _check_clipping(self, trainer: Any) -> None:
        refusals.check_clipping(self.settings, self.precision_plugin.gemini_precision, trainer)

    def _check_placement(self, trainer: Any, gemini_optimizer: Any) -> None:
        refusals.check_placement(self.settings, self.precision_plugin.gemini_precision, trainer, gemini_optimizer)

    # ------------------------------------------------------------------------------ environment

    @override
    def setup_environment(self) -> None:
        self.check_accelerator()
        load_colossalai()
        # What colossalai.launch would do, on Lightning's process group instead of its own.
        torch.cuda.set_device(self.root_device)
        super().setup_environment()
        watch_ranks(self.global_rank, self.world_size)
        lazy_init.seed_ranks_alike()

    @override
    def tensor_init_context(self, empty_init: bool | None = None) -> Any:
        # Gemini places parameters chunk by chunk; built on the GPU first, the whole model would have to fit.
        return contextlib.nullcontext()

    @override
    def model_sharded_context(self) -> Any:
        """Modules built in ``configure_model`` are lazy: materialised one parameter at a time as
        GeminiDDP moves them into (sharded) chunks."""
        return lazy_init.lazy_init_context(self.root_device, self.strategy_name)

    @override
    def model_to_device(self) -> None:
        """GeminiDDP moves parameters into chunks on the placement's devices."""

    # ----------------------------------------------------------------------------------- set-up

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @property
    @override
    def handles_gradient_accumulation(self) -> bool:
        return False

    def plugin_arguments(self, trainer: Any) -> dict[str, Any]:
        """The GeminiPlugin keyword arguments for this run of ``trainer``."""
        return gemini_setup.run_plugin_arguments(
            self.settings, str(self.precision_plugin.precision), self.world_size, trainer
        )

    @override
    def setup(self, trainer: Any) -> None:
        assert self.accelerator is not None
        self.refuse_weight_averaging(trainer)
        self.accelerator.setup(trainer)
        fitting = trainer.state.fn == TrainerFn.FITTING
        optimizer = None
        if fitting:
            self._check_clipping(trainer)
            gemini_setup.skip_sanity_check_before_tracing(self.settings, trainer, traced=self._gemini_model is not None)
            announce_kernel_build()
            self.setup_optimizers(trainer)
            self.check_optimizers(self.optimizers)
            optimizer = self.optimizers[0]
        if self._gemini_model is None:  # a model new to Gemini: its pretrained weights are read as it is chunked
            assert self.lightning_module is not None
            refusals.check_adapters(self.lightning_module)
            lazy_init.read_pretrained_when_built(self.lightning_module)
        self._gemini_plugin, model, gemini_optimizer = gemini_setup.configure_gemini(
            self._gemini_plugin, self._gemini_model, self.lightning_module, optimizer,
            lambda: self.plugin_arguments(trainer), self.settings.pins_offloaded_chunks,
        )  # fmt: skip
        self._gemini_model = model
        self.model = model
        if fitting:
            self.optimizers = [gemini_optimizer]
            self._check_placement(trainer, gemini_optimizer)
        self.setup_precision_plugin()

    @override
    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """GeminiOptimizer scales the loss (fp16) and runs backward under Gemini's chunk hooks."""
        assert self.lightning_module is not None
        self.pre_backward(closure_loss)
        closure_loss = self.precision_plugin.pre_backward(closure_loss, self.lightning_module)
        self.gemini_optimizer.backward(closure_loss)
        self.precision_plugin.post_backward(closure_loss, self.lightning_module)
        self.post_backward(closure_loss)
        return closure_loss

    @property
    def gemini_optimizer(self) -> Any:
        if not self.optimizers:
            raise RuntimeError("ColossalAIStrategy has no optimizer: backward is only possible while fitting.")
        return getattr(self.optimizers[0], "_optimizer", self.optimizers[0])

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        trainer = getattr(self.lightning_module, "_trainer", None)
        statistics.log_memory_statistics(trainer, self.is_global_zero, self.memory_statistics)
        return output

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """Predictions as plain tensors: through GeminiDDP they come back as ColossalAI's ColoTensor, which a file of
        them saved with torch.save cannot be loaded as with torch's default weights_only=True."""
        return apply_to_collection(super().predict_step(*args, **kwargs), torch.Tensor, _plain_tensor)

    # ------------------------------------------------------------------------------------ memory

    def memory_statistics(self) -> dict[str, float]:
        """Chunk bytes and optimizer bytes per device, and the traced peak of non-model data ("auto")."""
        if self._gemini_model is None:
            return {}
        optimizer = self.gemini_optimizer if self.optimizers else None
        return statistics.memory_statistics(self._gemini_model, optimizer)

    # ------------------------------------------------------------------------------ checkpoints

    @override
    def lightning_module_state_dict(self, rank_zero_only: bool = True) -> dict[str, Any]:
        """The full model state gathered from the chunks, on CPU; with ``rank_zero_only`` only rank 0
        gets the tensors (the others an empty dict). Sharded checkpoints write the model themselves."""
        if self._gemini_model is None:
            return super().lightning_module_state_dict()
        if self.settings.state_dict_type == "sharded":
            return {}
        return checkpoint_state.gathered_model_state(self._gemini_model, rank_zero_only, self.is_global_zero)

    @override
    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        if self.settings.state_dict_type == "sharded":
            return {}
        optimizer = getattr(optimizer, "_optimizer", optimizer)
        state = optimizer.state_dict(only_rank_0=True)
        return state if self.is_global_zero else {}

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Write beside ``filepath``, published in one step once every rank is done (core's ``staged_save``)."""
        record_models(checkpoint, self.lightning_module)
        if "optimizer_states" in checkpoint and self.optimizers:
            checkpoint[checkpoint_state.LOSS_SCALER_KEY] = checkpoint_state.loss_scaler_state(self.gemini_optimizer)
        if self.settings.state_dict_type == "full":
            # The states were gathered before this call; rank 0 alone writes, through the CheckpointIO.
            with staged_checkpoint(filepath, self.checkpoint_io, self.is_global_zero, self.barrier) as target:
                super().save_checkpoint(checkpoint, target, storage_options)
            return
        sharded.check_sharded_target(filepath, storage_options)
        with staged_save(filepath, self.is_global_zero, self.barrier) as folder:
            gemini_io = self._gemini_plugin.get_checkpoint_io()
            sharded.save_sharded(
                gemini_io, self._gemini_model, self.optimizers, checkpoint, folder, self.shard_size_mb,
                write_meta=self.is_global_zero,
            )  # fmt: skip

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero:
            remove_checkpoint_path(filepath, self.checkpoint_io)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Load a full checkpoint file, a sharded folder, or another strategy's folder in its one-file form, after
        checking it is whole."""
        recover_before_load(checkpoint_path, self.is_global_zero, self.barrier)
        # Another strategy's folder that its package writes as one file without losing anything (DCP, ZeRO) is
        # read in that form, converted once by rank 0 and kept inside it.
        checkpoint_path = one_file_for(checkpoint_path, self, weights_only, native=(COLOSSALAI.key,))
        if not (is_local(checkpoint_path) and Path(checkpoint_path).is_dir()):
            check_checkpoint_file(checkpoint_path, self.checkpoint_io, "ColossalAIStrategy")
            checkpoint = super().load_checkpoint(checkpoint_path, **weights_only_keyword(weights_only))
            check_trainer_checkpoint(checkpoint, checkpoint_path)
            return checkpoint
        path = Path(checkpoint_path)
        with_optimizer = bool(self.optimizers) and self.lightning_restore_optimizer
        meta = self.check_sharded_checkpoint(path, with_optimizer, weights_only)
        if self._gemini_model is None:
            raise RuntimeError("ColossalAIStrategy loads a sharded checkpoint only after the model is set up.")
        gemini_io = self._gemini_plugin.get_checkpoint_io()
        sharded.load_sharded(gemini_io, self._gemini_model, self.optimizers if with_optimizer else [], path)
        return meta

    check_sharded_checkpoint = staticmethod(sharded.check_sharded_checkpoint)

    @override
    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        if checkpoint.get(sharded.SHARDED_MARKER):
            return  # loaded from the shard files in load_checkpoint
        if self._gemini_model is None:
            super().load_model_state_dict(checkpoint, strict=strict)
            return
        with checkpoint_state.fp32_chunk_transfers(self._gemini_model):
            self._gemini_model.load_state_dict(checkpoint["state_dict"], strict=strict)

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        if self.optimizers:
            checkpoint_state.load_loss_scaler_state(
                self.gemini_optimizer, checkpoint.get(checkpoint_state.LOSS_SCALER_KEY)
            )
        if not checkpoint.get(sharded.SHARDED_MARKER):  # else loaded from the shard files in load_checkpoint
            assert self.lightning_module is not None  # restoring a fit: set up
            for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"], strict=True):
                gemini_optimizer = getattr(optimizer, "_optimizer", optimizer)
                gemini_optimizer.load_state_dict(for_gemini(state, gemini_optimizer, self.lightning_module))
        if self.optimizers:
            checkpoint_state.replay_cpu_adam_kernel(self.gemini_optimizer.optim)

    # --------------------------------------------------------------------------------- teardown

    @override
    def teardown(self) -> None:
        # Lightning's teardown moves the module and optimizer to CPU; Gemini's parameters live in
        # chunks, so only the plugins are torn down and the chunks are kept for a later run.
        assert self.accelerator is not None
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()
        undo_import_changes()


def _plain_tensor(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.as_subclass(torch.Tensor)
