"""The one body of the Trainer and the Fabric FSDP2 strategies: constructor, options, process group, collectives and
checkpoint writing, written once. ``strategy.py`` and ``fabric.py`` are thin faces over it that keep Lightning's two
method names and signatures. Nothing here imports ``lightning.pytorch``, so the Fabric face stays free of Trainer
modules.

The constructor takes Lightning's FSDPStrategy parameters (``options.py`` maps them onto FSDP2). Each face takes a
copy under its own name (core's ``constructor_for``, so a wrong call's error names the class the user called):
Fabric's as written, the Trainer's with ``precision`` named ``precision_plugin``, as each entry point's
``ParallelStrategy`` names it. tests/test_trainer_fabric_agree.py holds the two signatures in agreement.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from lightning.fabric.accelerators import Accelerator
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.utilities.distributed import _distributed_is_initialized, _sync_ddp_if_available
from lightning.fabric.utilities.distributed import group as distributed_group
from torch import Tensor, nn
from typing_extensions import override

from lightning_strategies.checkpoints import recover_before_load
from lightning_strategies.hugging_face import deferred_pretrained_loading
from lightning_strategies_fsdp import checkpoint as checkpoints
from lightning_strategies_fsdp.lightning_attributes import LightningAttributesMixin
from lightning_strategies_fsdp.options import (
    STATE_DICT_TYPES,
    STRATEGY,
    BackwardPrefetchName,
    CpuOffload,
    DeviceMeshShape,
    MixedPrecisionSettings,
    ModuleClasses,
    ShardingStrategyName,
    StateDictType,
    WrapPolicy,
    parse_options,
)
from lightning_strategies_fsdp.process_group import ProcessGroupMixin
from lightning_strategies_fsdp.sharding import refuse_loads_into_meta, set_gradient_sync, shard_model

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

# The constructor parameters parse_options maps onto FSDP2; the rest of **kwargs goes to fully_shard.
SHARDING_PARAMETERS = tuple(
    name
    for name, parameter in inspect.signature(parse_options).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
)


class FSDP2Body(LightningAttributesMixin, ProcessGroupMixin):
    """Everything the Trainer and the Fabric strategy do alike; mixed in before Lightning's base class."""

    # Each face's own launcher class: the Trainer's and Fabric's are distinct classes of the same name.
    launcher_class: ClassVar[type]
    # The keyword each entry point's ParallelStrategy takes the precision plugin by: "precision_plugin" or "precision".
    precision_keyword: ClassVar[str]
    checkpoint_io: Any
    is_global_zero: bool
    _checkpoint_io: Any
    _launcher: Any

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        auto_wrap_policy: WrapPolicy | None = None,
        cpu_offload: CpuOffload | None = False,
        mixed_precision: MixedPrecisionSettings | None = None,
        sharding_strategy: ShardingStrategyName = "FULL_SHARD",
        backward_prefetch: BackwardPrefetchName | None = None,
        forward_prefetch: bool = False,
        limit_all_gathers: bool = True,
        use_orig_params: bool = True,
        param_init_fn: Callable[[torch.nn.Module], None] | None = None,
        sync_module_states: bool = False,
        activation_checkpointing: ModuleClasses | None = None,
        activation_checkpointing_policy: WrapPolicy | None = None,
        device_mesh: DeviceMeshShape | None = None,
        state_dict_type: StateDictType = "sharded",
        **kwargs: Any,
    ) -> None:
        """``kwargs``: ``fully_shard`` arguments passed through (``shard_placement_fn``, ``ignored_params``), and
        FSDP1 ones accepted with a warning that says what replaced them."""
        super().__init__(  # type: ignore[call-arg]  # Lightning's strategy, after this mixin
            accelerator, parallel_devices, cluster_environment, checkpoint_io, **{self.precision_keyword: precision}
        )
        arguments = locals()
        self.options = parse_options(**{name: arguments[name] for name in SHARDING_PARAMETERS}, **kwargs)
        self.mixed_precision = mixed_precision
        if state_dict_type not in STATE_DICT_TYPES:
            # Lightning's words, which it says only when saving or loading; ours refuses the strategy at once.
            raise ValueError(
                f"Unknown state_dict_type: {state_dict_type}. {STRATEGY}(state_dict_type={state_dict_type!r}) is not "
                f"valid. Choose one of: {', '.join(map(repr, STATE_DICT_TYPES))}."
            )
        self.state_dict_type = state_dict_type
        self._process_group_backend = process_group_backend
        self._timeout = timeout
        self._device_mesh: DeviceMesh | None = None
        self._num_nodes = 1
        self._finish_init()

    def _finish_init(self) -> None:
        """What a face sets up after the shared constructor."""

    @property  # type: ignore[explicit-override]  # mypy#15900: a property with a setter never counts as marked
    @override
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def process_group_backend(self) -> str | None:
        return self._process_group_backend

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = self.launcher_class(self.cluster_environment, self.num_processes, self.num_nodes)

    def _shard(self, module: nn.Module) -> nn.Module:
        return shard_model(module, self.options, self.device_mesh, self.root_device, self.mixed_precision_config)

    def _init_context(self, empty_init: bool | None, precision_context: AbstractContextManager) -> ExitStack:
        """With ``empty_init`` the model is created on the meta device and materialized shard by shard when it
        is sharded."""
        stack = ExitStack()
        if empty_init:
            stack.enter_context(self._deferred_init())
        stack.enter_context(precision_context)
        return stack

    def _deferred_init(self) -> ExitStack:
        """Modules created inside are built on the meta device, ``from_pretrained`` ones too (their weights are read
        into each shard once the model is sharded), and nothing is allocated until ``_shard``."""
        stack = ExitStack()
        stack.enter_context(deferred_pretrained_loading(STRATEGY))
        stack.enter_context(refuse_loads_into_meta(STRATEGY))
        stack.enter_context(torch.device("meta"))
        return stack

    # Collectives ------------------------------------------------------------------------------

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if not _distributed_is_initialized():
            return
        if torch.distributed.get_backend() == "nccl":
            torch.distributed.barrier(device_ids=[self.root_device.index])
        else:
            torch.distributed.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not _distributed_is_initialized():
            return obj
        container = [obj]
        torch.distributed.broadcast_object_list(container, src, group=distributed_group.WORLD)
        return container[0]

    def _reduce(self, tensor: Tensor | Any, group: Any | None, reduce_op: Any) -> Tensor:
        if isinstance(tensor, Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    # Checkpoints -------------------------------------------------------------------------------

    @property
    def _full_state(self) -> bool:
        return self.state_dict_type == "full"

    def _agreed_path(self, path: Any) -> Path:
        """Rank 0's path, which every process reads and writes under."""
        return Path(self.broadcast(str(path)))

    def _refuse_storage_options(self, storage_options: Any) -> None:
        if storage_options is not None and not self._full_state:
            raise TypeError(
                f"`{STRATEGY}.save_checkpoint(..., storage_options=...)` is not supported because `{STRATEGY}` does "
                f"not use the `CheckpointIO`. Here {STRATEGY}(state_dict_type='sharded') writes checkpoints with "
                "torch.distributed.checkpoint, which takes no storage_options: drop them, or save with "
                "state_dict_type='full', which writes through the CheckpointIO plugin."
            )

    def _save_full(self, path: Path, state: dict[str, Any], storage_options: Any) -> None:
        """One file through the CheckpointIO plugin: the full state is gathered on rank 0 already, which writes it."""
        write = checkpoints.checkpoint_io_writer(self.checkpoint_io, storage_options)
        with checkpoints.staged_full_checkpoint(path, self.checkpoint_io, self.is_global_zero, self.barrier) as to:
            checkpoints.save_full(to, state, self.global_rank, write)

    def _save_sharded(self, path: Path, tensors: dict[str, Any], metadata: dict[str, Any]) -> None:
        """A DCP folder, one shard per process."""
        checkpoints.warn_if_checkpoint_io_unused(self._checkpoint_io)
        with checkpoints.staged_checkpoint(path, self.is_global_zero, self.barrier) as staged:
            checkpoints.save_sharded(staged, tensors, metadata, self.global_rank)

    def _path_to_load(self, path: Any) -> Path:
        """Rank 0's path, with a save that a crash interrupted completed or rolled back first."""
        agreed = self._agreed_path(path)
        recover_before_load(agreed, self.is_global_zero, self.barrier)
        return agreed


@contextmanager
def gradient_sync_paused(module: nn.Module) -> Generator[None, None, None]:
    """Gradient accumulation: skip the reduce-scatter until the last micro-batch."""
    set_gradient_sync(module, False)
    try:
        yield
    finally:
        set_gradient_sync(module, True)
