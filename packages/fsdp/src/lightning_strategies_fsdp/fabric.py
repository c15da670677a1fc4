"""``Fabric(strategy="fsdp")`` on FSDP2, with the same arguments and checkpoints as the Trainer strategy."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.fabric.strategies.parallel import ParallelStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer

from lightning_strategies import constructor_for
from lightning_strategies.checkpoints import load_file
from lightning_strategies_fsdp import checkpoint as checkpoints
from lightning_strategies_fsdp.body import FSDP2Body, gradient_sync_paused
from lightning_strategies_fsdp.clipping import clip_grad_norm_
from lightning_strategies_fsdp.options import STRATEGY


class FSDP2FabricStrategy(FSDP2Body, ParallelStrategy):
    """Fully Sharded Data Parallel on ``fully_shard`` for Fabric; see ``FSDP2Strategy`` for the arguments.

    ``fabric.setup(model, optimizer)`` points the optimizer at the sharded parameters (sharding replaces them);
    creating the optimizer after ``fabric.setup(model)`` works as well.
    """

    launcher_class = _SubprocessScriptLauncher

    # The body's constructor under this class's name, which Python's errors for a wrong call then name.
    __init__ = constructor_for(__qualname__, FSDP2Body.__init__)
    precision_keyword = "precision"

    def _finish_init(self) -> None:
        self._backward_sync_control = _GradientSyncControl()

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
        return self._shard(module)

    def module_to_device(self, module: Module) -> None:
        pass  # fully_shard places each shard

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager:
        return self._init_context(empty_init, self.precision.module_init_context())

    def all_reduce(self, tensor: Tensor, group: Any | None = None, reduce_op: Any = "mean") -> Tensor:
        return self._reduce(tensor, group, reduce_op)

    def get_module_state_dict(self, module: Module) -> dict[str, Any]:
        return checkpoints.model_state(module, full=self._full_state)

    def save_checkpoint(
        self,
        path: Any,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        self._refuse_storage_options(storage_options)
        if filter is not None:
            raise NotImplementedError(f"{STRATEGY}.save_checkpoint(filter=...) is not supported.")
        path = self._agreed_path(path)
        _, model = _the_model(state)
        tensors: dict[str, Any] = {}
        metadata: dict[str, Any] = {}
        for key, value in state.items():
            if value is model:
                tensors[key] = checkpoints.model_state(model, self._full_state)
            elif isinstance(value, Optimizer):
                tensors[key] = checkpoints.optimizer_state(model, value, self._full_state)
            else:
                metadata[key] = value.state_dict() if hasattr(value, "state_dict") else value
        if self._full_state:
            self._save_full(path, {**tensors, **metadata}, storage_options)
        else:
            self._save_sharded(path, tensors, metadata)

    def clip_gradients_norm(
        self,
        module: Module,
        optimizer: Optimizer,
        max_norm: float | int,
        norm_type: float | int = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Clips through clipping.py: torch's reduction fails for CPU-offloaded shards on a CUDA mesh."""
        self.precision.unscale_gradients(optimizer)
        return clip_grad_norm_(self.precision.main_params(optimizer), max_norm, norm_type, error_if_nonfinite)

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
        path = self._path_to_load(path)
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
        with gradient_sync_paused(module):
            yield
