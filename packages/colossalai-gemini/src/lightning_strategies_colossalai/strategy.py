"""ColossalAIStrategy: ColossalAI 0.5 Gemini (GeminiDDP + GeminiOptimizer) under Lightning's own
launcher and process group, with the parameters of the Lightning 1.x ColossalAIStrategy.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_strategies import CapabilityError, CheckpointError
from lightning_strategies.checkpoints import (
    COLOSSALAI,
    check_checkpoint_file,
    check_trainer_checkpoint,
    foreign_checkpoint_error,
    identify,
    is_local,
    recover_before_load,
    remove_checkpoint_path,
    staged_save,
    weights_only_keyword,
)
from lightning_strategies.checkpoints import staged_checkpoint_io_save as staged_checkpoint
from lightning_strategies.precision import OwnPrecisionMixin
from lightning_strategies.ranks import ReportFailuresMixin, watch_ranks
from lightning_strategies_colossalai.backend import load_colossalai
from lightning_strategies_colossalai.checkpoint_state import (
    fp32_chunk_transfers,
    load_loss_scaler_state,
    loss_scaler_state,
)
from lightning_strategies_colossalai.chunk_placement import chunks_with_gpu_master_weights, kept_gathered_parameters
from lightning_strategies_colossalai.kernels import announce_kernel_build
from lightning_strategies_colossalai.memory import memory_statistics
from lightning_strategies_colossalai.options import (
    MEBI,
    GeminiSettings,
    gemini_plugin_arguments,
)
from lightning_strategies_colossalai.precision import GeminiPrecision
from lightning_strategies_colossalai.sharded_checkpoint import (
    META_FILE,
    MODEL_FOLDER,
    OPTIMIZER_FOLDER,
    SHARDED_MARKER,
    check_sharded_folder,
    is_sharded_folder,
    read_sharded_meta,
    sharded_meta,
)

ALLOWED_OPTIMIZERS = ("colossalai.nn.optimizer.HybridAdam", "colossalai.nn.optimizer.CPUAdam")
_LOSS_SCALER_KEY = "colossalai_loss_scaler"
_READS = "its sharded checkpoint folders (meta.pt + model/) and full checkpoint files"

# Seen on an H200 (torch 2.11, colossalai 0.5.0): GeminiPlugin placement "auto" with bf16 gave a NaN
# loss at every step on 1.3B and 2.7B GPTs while "static" placement trained. The cause is not
# established (benchmarks/auto_bf16_nan.py narrows it down), so the combination is refused.
AUTO_BF16_REASON = (
    "ColossalAI 0.5 Gemini with placement 'auto' and bf16 produced a NaN loss at every step on 1.3B and 2.7B "
    "GPT models on an H200, while placement 'cuda'/'cpu' trained; the cause is not established, so this "
    "strategy refuses the combination rather than train on silently broken weights. "
    "Use precision='16-mixed' with placement 'auto', "
    "or keep bf16 with strategy='colossalai_cuda' or 'colossalai_cpu'."
)
# HybridAdam/CPUAdam update bf16 gradients held on CPU with a plain torch fallback that ignores the
# combined scale GeminiOptimizer passes in, and that scale is how Gemini applies max_norm.
CPU_BF16_CLIP_REASON = (
    "with bf16, ColossalAI 0.5's HybridAdam/CPUAdam update CPU-held gradients through a torch fallback that "
    "ignores the clipping scale, so gradient_clip_val would silently not apply to offloaded chunks. Use "
    "precision='16-mixed', or strategy='colossalai_cuda' (optimizer on the GPU), or no gradient clipping."
)
# CPUAdam updates master weights held on the GPU with a plain torch Adam that takes no gradient scale, and
# asserts when GeminiOptimizer passes one (the fp16 loss scale, or a clipping factor).
CPU_ADAM_ON_GPU_REASON = (
    "ColossalAI 0.5's CPUAdam updates master weights held on the GPU with a plain torch Adam that cannot divide "
    "the gradients by GeminiOptimizer's scale (the fp16 loss scale and the gradient clipping factor); it stops "
    "with 'div_scale should remain default'. Use colossalai.nn.optimizer.HybridAdam, which updates chunks on "
    "GPU and CPU and applies the scale on both; or keep CPUAdam with placement_policy='cpu' and a model of at "
    "least min_chunk_size parameters (or a smaller min_chunk_size), so every chunk is offloaded."
)


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
        placement_policy: str = "auto",
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
        state_dict_type: str = "full",
        shard_size_mb: int = 1024,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
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
            accelerator: The accelerator; must be CUDA.
            parallel_devices: The devices to train on (set by the Trainer).
            cluster_environment: The cluster environment (set by the Trainer).
            checkpoint_io: Checkpoint IO plugin for full checkpoints.
            precision_plugin: Precision plugin; defaults to Gemini's own for the Trainer's precision.
            process_group_backend: Process group backend; defaults to NCCL.
            timeout: Timeout of collective operations.
        """
        self.settings = GeminiSettings(
            use_chunk=use_chunk,
            chunk_size=chunk_size,
            enable_distributed_storage=enable_distributed_storage,
            placement_policy=placement_policy,
            force_outputs_fp32=force_outputs_fp32,
            gpu_margin_mem_ratio=gpu_margin_mem_ratio,
            chunk_search_range=chunk_search_range,
            chunk_search_n_grids=chunk_search_n_grids,
            min_chunk_size=min_chunk_size,
            initial_scale=initial_scale,
            min_scale=min_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            hysteresis=hysteresis,
            max_scale=max_scale,
            state_dict_type=state_dict_type,
        )
        self.settings.warn_obsolete()
        if not isinstance(shard_size_mb, int) or shard_size_mb <= 0:
            raise ValueError(f"ColossalAIStrategy(shard_size_mb={shard_size_mb!r}) must be a positive integer.")
        self.shard_size_mb = shard_size_mb
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self._gemini_plugin: Any = None
        self._gemini_model: Any = None

    # ----------------------------------------------------------------------------------- checks

    def own_precision_plugin(self, precision: str) -> GeminiPrecision:
        plugin = GeminiPrecision(precision)
        if self.settings.placement_policy == "auto" and plugin.gemini_precision == "bf16":
            raise CapabilityError(AUTO_BF16_REASON)
        self.settings.warn_precision(precision)
        return plugin

    def check_accelerator(self) -> None:
        """Refuse anything but CUDA, before processes are launched or colossalai is imported."""
        if self.accelerator is not None and not isinstance(self.accelerator, CUDAAccelerator):
            name = type(self.accelerator).__name__
            placement = self.settings.placement_policy
            raise CapabilityError(
                f"ColossalAIStrategy needs a CUDA GPU, but the accelerator is {name}. Gemini runs its kernels "
                f"in CUDA memory; placement_policy={placement!r} only chooses where chunks and optimizer states "
                "are kept between uses"
                + (" (with 'cpu', as in colossalai_cpu, CPU memory is the offload target, and training still "
                   "runs on the GPU)" if placement == "cpu" else "")
                + ". Use Trainer(accelerator='cuda', ...) on a machine with an NVIDIA GPU; for CPU-only training "
                "pick another strategy (for example deepspeed or fsdp from lightning-strategies)."
            )  # fmt: skip

    def _configure_launcher(self) -> None:
        self.check_accelerator()
        super()._configure_launcher()

    @staticmethod
    def check_optimizers(optimizers: list[Any]) -> None:
        """Gemini steps exactly one HybridAdam or CPUAdam (GeminiOptimizer refuses any other type)."""
        from colossalai.nn.optimizer import CPUAdam, HybridAdam

        if len(optimizers) != 1:
            raise ValueError(
                f"ColossalAIStrategy supports exactly one optimizer, configure_optimizers returned {len(optimizers)}."
            )
        optimizer = optimizers[0]
        if type(optimizer) not in (HybridAdam, CPUAdam):
            raise TypeError(
                f"ColossalAIStrategy needs one of {', '.join(ALLOWED_OPTIMIZERS)} (their chunk-aware kernels "
                f"update fp32 master weights on GPU and CPU); configure_optimizers returned "
                f"{type(optimizer).__module__}.{type(optimizer).__qualname__}. For example: "
                "`from colossalai.nn.optimizer import HybridAdam; "
                "return HybridAdam(self.parameters(), lr=1e-3)`."
            )

    def _check_clipping(self, trainer: Any) -> None:
        clip = trainer.gradient_clip_val
        if not clip:
            return
        if trainer.gradient_clip_algorithm not in (None, "norm"):
            raise CapabilityError(
                "ColossalAIStrategy clips gradients by norm only (GeminiOptimizer has no clip by value); "
                "use Trainer(gradient_clip_algorithm='norm')."
            )
        if self.precision_plugin.gemini_precision == "bf16" and self.settings.placement_policy != "cuda":
            raise CapabilityError(
                f"gradient_clip_val={clip} with placement {self.settings.placement_policy!r}: " + CPU_BF16_CLIP_REASON
            )

    # ------------------------------------------------------------------------------ environment

    def setup_environment(self) -> None:
        self.check_accelerator()
        load_colossalai()
        # What colossalai.launch would do, on Lightning's process group instead of its own.
        torch.cuda.set_device(self.root_device)
        super().setup_environment()
        watch_ranks(self.global_rank, self.world_size)
        self._seed_ranks_alike()

    def _seed_ranks_alike(self) -> None:
        """Give every rank the same seed so lazily built parameters materialise identically.

        With ``seed_everything`` Lightning has already done so; otherwise rank 0's seed is shared.
        """
        if "PL_GLOBAL_SEED" in os.environ:
            return
        seed = [int(torch.randint(0, 2**31 - 1, ()).item())]
        torch.distributed.broadcast_object_list(seed, src=0)
        seed_everything(seed[0], verbose=False)
        rank_zero_info(f"ColossalAIStrategy: seeded every rank with {seed[0]} so parameters initialise alike.")

    def tensor_init_context(self, empty_init: bool | None = None) -> Any:
        # Gemini places parameters itself (chunk by chunk); creating them on the GPU first would
        # need the whole unsharded model in GPU memory.
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        """Modules built in ``configure_model`` are lazy: materialised one parameter at a time as
        GeminiDDP moves them into (sharded) chunks."""
        from colossalai.lazy import LazyInitContext

        with LazyInitContext(default_device=self.root_device):
            yield

    def model_to_device(self) -> None:
        """GeminiDDP moves parameters into chunks on the placement's devices."""

    # ----------------------------------------------------------------------------------- set-up

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @property
    def handles_gradient_accumulation(self) -> bool:
        return False

    def plugin_arguments(self, trainer: Any) -> dict[str, Any]:
        """The GeminiPlugin keyword arguments for this run of ``trainer``."""
        fitting = trainer.state.fn == TrainerFn.FITTING
        arguments = gemini_plugin_arguments(
            self.settings,
            str(self.precision_plugin.precision),
            self.world_size,
            accumulate_grad_batches=trainer.accumulate_grad_batches if fitting else 1,
            gradient_clip_val=trainer.gradient_clip_val if fitting else None,
        )
        if not fitting and arguments["placement_policy"] == "auto":
            # "auto" learns its layout from a training step; evaluation alone keeps chunks on the GPU.
            arguments.update(placement_policy="static", offload_optim_frac=0.0, offload_param_frac=0.0)
        return arguments

    @staticmethod
    def refuse_weight_averaging(trainer: Any) -> None:
        """Lightning's StochasticWeightAveraging refuses its sharded strategies (DeepSpeed, FSDP) by class; Gemini
        shards as they do, and Lightning has no class of it to check, so the strategy refuses for itself."""
        if any(isinstance(callback, StochasticWeightAveraging) for callback in trainer.callbacks):
            raise MisconfigurationException(
                "StochasticWeightAveraging keeps a full copy of the model, which ColossalAI's Gemini holds in shards "
                "(chunks spread over ranks and devices); Lightning refuses it for its sharded strategies as well. "
                "Remove the callback, or train with Trainer(strategy='ddp') to average weights."
            )

    def setup(self, trainer: Any) -> None:
        assert self.accelerator is not None
        self.refuse_weight_averaging(trainer)
        self.accelerator.setup(trainer)
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self._check_clipping(trainer)
        if (
            fitting
            and self.settings.placement_policy == "auto"
            and self._gemini_model is None
            and trainer.num_sanity_val_steps
        ):
            rank_zero_warn(
                "ColossalAIStrategy: placement 'auto' needs one training step to trace memory before it can "
                "evaluate, so the sanity-check validation is skipped."
            )
            trainer.num_sanity_val_steps = 0

        optimizer = None
        if fitting:
            announce_kernel_build()
            self.setup_optimizers(trainer)
            self.check_optimizers(self.optimizers)
            optimizer = self.optimizers[0]

        if self._gemini_model is None or self._gemini_model.module is not self.lightning_module:
            from colossalai.booster.plugin import GeminiPlugin

            self._gemini_plugin = GeminiPlugin(**self.plugin_arguments(trainer))
            module: Any = self.lightning_module
        else:
            module = self._gemini_model  # a later fit/validate/test of the same model reuses its chunks
        model, gemini_optimizer, *_ = self._gemini_plugin.configure(module, optimizer)
        self._gemini_model = model
        self.model = model
        if fitting:
            self.optimizers = [gemini_optimizer]
            self._check_placement(trainer, gemini_optimizer)
        self.setup_precision_plugin()

    def _check_placement(self, trainer: Any, gemini_optimizer: Any) -> None:
        """Say where Gemini kept chunks on the GPU against the placement, and refuse what CPUAdam cannot step."""
        kept = kept_gathered_parameters(gemini_optimizer)
        if kept and self.settings.placement_policy == "cpu":
            rank_zero_warn(
                f"ColossalAIStrategy: placement 'cpu' offloads nothing for {kept} parameters: Gemini keeps a model "
                f"smaller than min_chunk_size={self.settings.min_chunk_size} parameters (or any chunk when "
                "enable_distributed_storage=False) gathered on the GPU with its optimizer states. Pass a smaller "
                "min_chunk_size (or a chunk_size with enable_distributed_storage=True) to offload it."
            )
        from colossalai.nn.optimizer import CPUAdam

        if type(gemini_optimizer.optim) is not CPUAdam:
            return
        scaled = self.precision_plugin.gemini_precision == "fp16" or bool(trainer.gradient_clip_val)
        on_gpu = chunks_with_gpu_master_weights(gemini_optimizer)
        # With "auto" and a GPU margin, GeminiOptimizer moves master weights to the GPU at the first step.
        may_move = self.settings.placement_policy == "auto" and self.settings.gpu_margin_mem_ratio > 0
        if scaled and (on_gpu or may_move):
            where = (
                f"{on_gpu} chunk(s) with master weights on the GPU"
                if on_gpu
                else "placement 'auto' with gpu_margin_mem_ratio > 0"
            )
            raise CapabilityError(
                f"ColossalAIStrategy: CPUAdam with {where} and "
                f"{'fp16 loss scaling' if self.precision_plugin.gemini_precision == 'fp16' else 'gradient clipping'}"
                f": {CPU_ADAM_ON_GPU_REASON}"
            )

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

    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        self._log_memory_statistics()
        return output

    # ------------------------------------------------------------------------------------ memory

    def memory_statistics(self) -> dict[str, float]:
        """Bytes of model data (chunks) per device, traced peak non-model data ("auto" placement,
        after the first step), and bytes held for the optimizer per device."""
        if self._gemini_model is None:
            return {}
        optimizer = self.gemini_optimizer if self.optimizers else None
        return memory_statistics(self._gemini_model, optimizer)

    def _log_memory_statistics(self) -> None:
        trainer = getattr(self.lightning_module, "_trainer", None)
        if trainer is None or not trainer.loggers or not self.is_global_zero:
            return
        if trainer.global_step % max(1, trainer.log_every_n_steps) != 0:
            return
        stats = self.memory_statistics()
        for logger in trainer.loggers:
            logger.log_metrics(stats, step=trainer.global_step)

    # ------------------------------------------------------------------------------ checkpoints

    def lightning_module_state_dict(self, rank_zero_only: bool = True) -> dict[str, Any]:
        """The full model state gathered from the chunks, on CPU; with ``rank_zero_only`` only rank 0
        gets the tensors (the others an empty dict). Sharded checkpoints write the model themselves."""
        if self._gemini_model is None:
            return super().lightning_module_state_dict()
        if self.settings.state_dict_type == "sharded":
            return {}
        with fp32_chunk_transfers(self._gemini_model):
            state = self._gemini_model.state_dict(only_rank_0=rank_zero_only)
        if rank_zero_only and not self.is_global_zero:
            return {}
        return {key: value.cpu() if isinstance(value, torch.Tensor) else value for key, value in state.items()}

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        if self.settings.state_dict_type == "sharded":
            return {}
        optimizer = getattr(optimizer, "_optimizer", optimizer)
        state = optimizer.state_dict(only_rank_0=True)
        return state if self.is_global_zero else {}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Write the checkpoint beside ``filepath`` and publish it there in one step once every rank is done,
        so a crash mid-save leaves the previous checkpoint under the name (core's ``staged_save``)."""
        if "optimizer_states" in checkpoint and self.optimizers:
            checkpoint[_LOSS_SCALER_KEY] = loss_scaler_state(self.gemini_optimizer)
        if self.settings.state_dict_type == "full":
            # The states were gathered before this call; rank 0 alone writes, through the CheckpointIO.
            with staged_checkpoint(filepath, self.checkpoint_io, self.is_global_zero, self.barrier) as target:
                super().save_checkpoint(checkpoint, target, storage_options)
            return
        if storage_options is not None:
            raise TypeError(
                "ColossalAIStrategy(state_dict_type='sharded') writes its own shard files and takes no "
                "storage_options; use state_dict_type='full' with a CheckpointIO plugin instead."
            )
        if not is_local(filepath):
            raise ValueError(
                f"ColossalAIStrategy(state_dict_type='sharded') writes shard files on a local or mounted file "
                f"system, not to {str(filepath)!r}. Save to a local path, or use state_dict_type='full' with a "
                "CheckpointIO plugin for remote storage."
            )
        with staged_save(filepath, self.is_global_zero, self.barrier) as folder:
            self._save_sharded(checkpoint, folder)

    def _save_sharded(self, checkpoint: dict[str, Any], folder: Path) -> None:
        """Every rank takes part in gathering the shards; rank 0 writes them and the meta file."""
        gemini_io = self._gemini_plugin.get_checkpoint_io()
        with fp32_chunk_transfers(self._gemini_model):
            gemini_io.save_model(
                self._gemini_model, str(folder / MODEL_FOLDER), shard=True, size_per_shard=self.shard_size_mb
            )
        # A weights-only checkpoint (ModelCheckpoint(save_weights_only=True)) has no optimizer_states.
        if "optimizer_states" in checkpoint:
            for optimizer in self.optimizers:
                gemini_io.save_optimizer(
                    getattr(optimizer, "_optimizer", optimizer),
                    str(folder / OPTIMIZER_FOLDER),
                    shard=True,
                    size_per_shard=self.shard_size_mb,
                )
        if self.is_global_zero:
            torch.save(sharded_meta(checkpoint, len(self.optimizers)), folder / META_FILE)

    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero:
            remove_checkpoint_path(filepath, self.checkpoint_io)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Load a full checkpoint file or a sharded folder, after checking it is whole and is ColossalAI's."""
        recover_before_load(checkpoint_path, self.is_global_zero, self.barrier)
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
        with fp32_chunk_transfers(self._gemini_model):
            gemini_io.load_model(self._gemini_model, str(path / MODEL_FOLDER), strict=True)
        if with_optimizer:
            for optimizer in self.optimizers:
                gemini_io.load_optimizer(getattr(optimizer, "_optimizer", optimizer), str(path / OPTIMIZER_FOLDER))
        return meta

    @staticmethod
    def check_sharded_checkpoint(path: Path, with_optimizer: bool, weights_only: bool | None) -> dict[str, Any]:
        """Check a sharded checkpoint folder before ColossalAI reads it and return its ``meta.pt``.

        Another strategy's folder, or a folder of no known format, is refused with what it is and how to
        convert it; an incomplete or damaged one with what is missing.
        """
        found = identify(path)
        if found not in (None, COLOSSALAI):
            raise foreign_checkpoint_error(path, "ColossalAIStrategy", here=_READS)
        if not is_sharded_folder(path):
            raise CheckpointError(
                f"{path} is a folder but not a ColossalAIStrategy sharded checkpoint (it needs {META_FILE} and "
                f"{MODEL_FOLDER}/). Point ckpt_path at a checkpoint written with state_dict_type='sharded', or at "
                "a full checkpoint file."
            )
        check_sharded_folder(path, with_optimizer)
        # Read first: a weights_only refusal stops the load before any shard is read.
        return read_sharded_meta(path, weights_only)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        if checkpoint.get(SHARDED_MARKER):
            return  # loaded from the shard files in load_checkpoint
        if self._gemini_model is None:
            super().load_model_state_dict(checkpoint, strict=strict)
            return
        with fp32_chunk_transfers(self._gemini_model):
            self._gemini_model.load_state_dict(checkpoint["state_dict"], strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        if self.optimizers:
            load_loss_scaler_state(self.gemini_optimizer, checkpoint.get(_LOSS_SCALER_KEY))
        if checkpoint.get(SHARDED_MARKER):
            return  # loaded from the shard files in load_checkpoint
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"], strict=True):
            getattr(optimizer, "_optimizer", optimizer).load_state_dict(state)

    # --------------------------------------------------------------------------------- teardown

    def teardown(self) -> None:
        # Lightning's teardown moves the module and optimizer to CPU; Gemini's parameters live in
        # chunks, so only the plugins are torn down and the chunks are kept for a later run.
        assert self.accelerator is not None
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()
