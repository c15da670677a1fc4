"""``Fabric(strategy="fsdp")`` on FSDP2, with the same arguments and checkpoints as the Trainer strategy."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.fabric.strategies.parallel import ParallelStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from lightning.fabric.utilities.distributed import (
    _distributed_is_initialized,
    _sync_ddp_if_available,
)
from lightning.fabric.utilities.distributed import group as distributed_group
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer

from lightning_strategies import check_choice
from lightning_strategies.checkpoints import load_file, recover_before_load
from lightning_strategies_fsdp import checkpoint as checkpoints
from lightning_strategies_fsdp.lightning_attributes import LightningAttributesMixin
from lightning_strategies_fsdp.options import STATE_DICT_TYPES, STRATEGY, parse_options
from lightning_strategies_fsdp.process_group import ProcessGroupMixin
from lightning_strategies_fsdp.sharding import set_gradient_sync, shard_model

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class FSDP2FabricStrategy(LightningAttributesMixin, ProcessGroupMixin, ParallelStrategy):
    """Fully Sharded Data Parallel on ``fully_shard`` for Fabric; see ``FSDP2Strategy`` for the arguments.

    ``fabric.setup(model, optimizer)`` points the optimizer at the sharded parameters (sharding replaces them);
    creating the optimizer after ``fabric.setup(model)`` works as well.
    """

    def __init__(
        self,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        auto_wrap_policy: Any = None,
        cpu_offload: Any = False,
        mixed_precision: Any = None,
        sharding_strategy: Any = "FULL_SHARD",
        backward_prefetch: Any = None,
        forward_prefetch: bool = False,
        limit_all_gathers: bool = True,
        use_orig_params: bool = True,
        param_init_fn: Callable[[Module], None] | None = None,
        sync_module_states: bool = False,
        activation_checkpointing_policy: Any = None,
        device_mesh: Any = None,
        state_dict_type: str = "sharded",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision=precision,
        )
        self.options = parse_options(
            auto_wrap_policy=auto_wrap_policy,
            activation_checkpointing_policy=activation_checkpointing_policy,
            cpu_offload=cpu_offload,
            mixed_precision=mixed_precision,
            sharding_strategy=sharding_strategy,
            backward_prefetch=backward_prefetch,
            forward_prefetch=forward_prefetch,
            limit_all_gathers=limit_all_gathers,
            use_orig_params=use_orig_params,
            param_init_fn=param_init_fn,
            sync_module_states=sync_module_states,
            device_mesh=device_mesh,
            **kwargs,
        )
        self.mixed_precision = mixed_precision
        self.state_dict_type = check_choice(STRATEGY, "state_dict_type", state_dict_type, STATE_DICT_TYPES)
        self._process_group_backend = process_group_backend
        self._timeout = timeout
        self._device_mesh: DeviceMesh | None = None
        self._num_nodes = 1
        self._backward_sync_control = _GradientSyncControl()

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def setup_environment(self) -> None:
        super().setup_environment()
        self.connect_processes()

    def _precision_flag(self) -> str:
        return str(self.precision.precision)

    def setup_module_and_optimizers(self, module: Module, optimizers: list[Optimizer], scheduler: Any = None) -> Any:
        """Shard the module, then point each optimizer at the sharded parameters that replaced the ones it was
        created with (matched by parameter name)."""
        names = {parameter: name for name, parameter in module.named_parameters(remove_duplicate=False)}
        for optimizer in optimizers:
            _check_rebindable(optimizer, names)
        module = self.setup_module(module)
        sharded = dict(module.named_parameters(remove_duplicate=False))
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["params"] = [sharded[names[parameter]] for parameter in group["params"]]
        return module, optimizers, scheduler

    def setup_module(self, module: Module) -> Module:
        return shard_model(module, self.options, self.device_mesh, self.root_device, self.mixed_precision_config)

    def module_to_device(self, module: Module) -> None:
        pass  # fully_shard places each shard

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager:
        stack = ExitStack()
        if empty_init:
            stack.enter_context(torch.device("meta"))  # materialized shard by shard in setup_module
        stack.enter_context(self.precision.module_init_context())
        return stack

    def all_reduce(self, tensor: Tensor, group: Any | None = None, reduce_op: Any = "mean") -> Tensor:
        if isinstance(tensor, Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

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

    def get_module_state_dict(self, module: Module) -> dict[str, Any]:
        return checkpoints.model_state(module, full=self.state_dict_type == "full")

    def save_checkpoint(
        self,
        path: Any,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        full = self.state_dict_type == "full"
        if storage_options is not None and not full:
            raise TypeError(
                f"{STRATEGY}(state_dict_type='sharded') writes checkpoints with torch.distributed.checkpoint, which "
                "takes no storage_options. Drop storage_options, or save with state_dict_type='full', which writes "
                "through the CheckpointIO plugin."
            )
        if filter is not None:
            raise NotImplementedError(f"{STRATEGY}.save_checkpoint(filter=...) is not supported.")
        path = Path(self.broadcast(str(path)))
        _, model = _the_model(state)
        tensors: dict[str, Any] = {}
        metadata: dict[str, Any] = {}
        for key, value in state.items():
            if value is model:
                tensors[key] = checkpoints.model_state(model, full)
            elif isinstance(value, Optimizer):
                tensors[key] = checkpoints.optimizer_state(model, value, full)
            else:
                metadata[key] = value.state_dict() if hasattr(value, "state_dict") else value
        if full:
            # The full state is gathered on rank 0 already: one file, which rank 0 writes.
            write = checkpoints.checkpoint_io_writer(self.checkpoint_io, storage_options)
            with checkpoints.staged_full_checkpoint(path, self.checkpoint_io, self.is_global_zero, self.barrier) as to:
                checkpoints.save_full(to, {**tensors, **metadata}, self.global_rank, write)
            return
        checkpoints.warn_if_checkpoint_io_unused(self._checkpoint_io)
        with checkpoints.staged_checkpoint(path, self.is_global_zero, self.barrier) as staged:
            checkpoints.save_sharded(staged, tensors, metadata, self.global_rank)

    def load_checkpoint(
        self,
        path: Any,
        state: Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if isinstance(state, Optimizer):
            # Its state is sharded as the model's parameters are: it loads only beside its model.
            raise NotImplementedError(
                f"{STRATEGY}.load_checkpoint of an optimizer alone is not supported. Load it with its model: "
                "fabric.load(path, {'model': model, 'optimizer': optimizer})."
            )
        if isinstance(state, Module):
            return self._load_raw_module(Path(self.broadcast(str(path))), state, strict, weights_only)
        if not isinstance(state, dict) or not state:
            raise ValueError(
                f"{STRATEGY}.load_checkpoint needs state={{'model': model, 'optimizer': optimizer, ...}} with the "
                f"set-up model in it, got {state!r}."
            )
        path = Path(self.broadcast(str(path)))
        recover_before_load(path, self.is_global_zero, self.barrier)
        model_key, model = _the_model(state)
        optimizers = {key: value for key, value in state.items() if isinstance(value, Optimizer)}
        read_full = checkpoints.checkpoint_io_reader(self.checkpoint_io, weights_only)
        rest = checkpoints.load_into(
            path, model, model_key, optimizers, strict=strict, weights_only=weights_only, read_full=read_full
        )
        for key in list(state):
            if key in (model_key, *optimizers) or key not in rest:
                continue
            if hasattr(state[key], "load_state_dict"):
                state[key].load_state_dict(rest.pop(key))
            else:
                state[key] = rest.pop(key)
        return rest

    def _load_raw_module(self, path: Path, module: Module, strict: bool, weights_only: bool | None) -> dict[str, Any]:
        """fabric.load_raw: one file holding the module's full state dict, as torch.save(model.state_dict()) writes."""
        if not path.is_file():
            raise ValueError(
                f"{STRATEGY}: fabric.load_raw reads one file holding the model's full state dict, and {path} is not a "
                "file. Pass that file, or load a checkpoint folder with fabric.load(path, {'model': model})."
            )
        read = checkpoints.checkpoint_io_reader(self.checkpoint_io, weights_only)
        state_dict = read(path) if read is not None else load_file(path, weights_only, mmap=True, map_location="cpu")
        checkpoints.load_full_state(path, {"model": state_dict}, module, "model", {}, strict=strict)
        return {}


def _check_rebindable(optimizer: Optimizer, names: dict[Any, str]) -> None:
    if optimizer.state:
        raise ValueError(
            f"{STRATEGY}: the {type(optimizer).__name__} passed to fabric.setup() has state already (it stepped), "
            "which cannot follow the parameters onto their shards. Create the optimizer fresh and pass it to "
            "fabric.setup(model, optimizer), or load its state with fabric.load() after setup."
        )
    foreign = sum(parameter not in names for group in optimizer.param_groups for parameter in group["params"])
    if foreign:
        raise ValueError(
            f"{STRATEGY}: the {type(optimizer).__name__} passed to fabric.setup() holds {foreign} parameter(s) that "
            "are not the model's. Create it from model.parameters() of the model set up with it."
        )


def _the_model(state: dict[str, Any]) -> tuple[str, Module]:
    from torch.distributed.fsdp import FSDPModule

    models = [(key, value) for key, value in state.items() if isinstance(value, FSDPModule)]
    if len(models) != 1:
        raise ValueError(
            f"{STRATEGY} checkpoints hold exactly one model set up with fabric.setup(); found {len(models)} in the "
            f"state keys {sorted(state)}."
        )
    return models[0]


class _GradientSyncControl(_BackwardSyncControl):
    @contextmanager
    def no_backward_sync(self, module: Module, enabled: bool) -> Any:
        if not enabled:
            yield
            return
        set_gradient_sync(module, False)
        try:
            yield
        finally:
            set_gradient_sync(module, True)
