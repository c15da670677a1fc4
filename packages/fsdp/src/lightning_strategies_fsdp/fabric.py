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
from typing_extensions import override

from lightning_strategies import constructor_for
from lightning_strategies.checkpoints import as_fabric_layout, load_file, one_file_for
from lightning_strategies.hugging_face import record_models, without_record
from lightning_strategies_fsdp import checkpoint as checkpoints
from lightning_strategies_fsdp.body import FSDP2Body, gradient_sync_paused
from lightning_strategies_fsdp.checkpoint_layout import DCP
from lightning_strategies_fsdp.clipping import clip_grad_norm_
from lightning_strategies_fsdp.float8 import drop_float8_scales_after_steps
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

    @override
    def _finish_init(self) -> None:
        self._backward_sync_control = _FSDPBackwardSyncControl()

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self.connect_processes()

    @override
    def _precision_flag(self) -> str:
        return str(self.precision.precision)

    @override
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
            drop_float8_scales_after_steps(optimizer)
        return module, optimizers, scheduler

    @override
    def setup_module(self, module: Module) -> Module:
        return self._shard(module)

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        drop_float8_scales_after_steps(optimizer)
        return super().setup_optimizer(optimizer)

    @override
    def module_to_device(self, module: Module) -> None:
        pass  # fully_shard places each shard

    @override
    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager:
        return self._init_context(empty_init, self.precision.module_init_context())

    @override
    def all_reduce(self, tensor: Tensor, group: Any | None = None, reduce_op: Any = "mean") -> Tensor:
        return self._reduce(tensor, group, reduce_op)

    @override
    def get_module_state_dict(self, module: Module) -> dict[str, Any]:
        return checkpoints.model_state(module, full=self._full_state)

    @override
    def save_checkpoint(
        self,
        path: Any,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        self._refuse_storage_options(storage_options)
        if filter is not None:
            raise NotImplementedError(
                "FSDP doesn't support loading sharded filtered checkpoints, so saving them is disabled. "
                f"{STRATEGY} refuses a filter for full checkpoints as well: save without one."
            )
        path = self._agreed_path(path)
        # The path before the state, in the order Lightning's strategy checks them.
        checkpoints.refuse_replacing_folder(path)
        _, model = _the_model(state, "save")
        tensors: dict[str, Any] = {}
        metadata: dict[str, Any] = {}
        for key, value in state.items():
            if value is model:
                tensors[key] = checkpoints.model_state(model, self._full_state)
                record_models(metadata, model, under=key)
            elif isinstance(value, Optimizer):
                tensors[key] = checkpoints.optimizer_state(model, value, self._full_state)
            else:
                metadata[key] = value.state_dict() if hasattr(value, "state_dict") else value
        if self._full_state:
            self._save_full(path, {**tensors, **metadata}, storage_options)
        else:
            self._save_sharded(path, tensors, metadata)

    @override
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

    @override
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
                "Loading a single optimizer object from a checkpoint is not supported yet with the FSDP strategy. "
                "Load it with its model: fabric.load(path, {'model': model, 'optimizer': optimizer})."
            )
        if isinstance(state, Module):
            return self._load_raw_module(Path(self.broadcast(str(path))), state, strict, weights_only)
        if not isinstance(state, dict) or not state:
            raise ValueError(
                f"Got {STRATEGY}.load_checkpoint(..., state={state!r}) but a state with at least  a model instance to "
                f"reload is required. Pass it in like so: {STRATEGY}.load_checkpoint(..., state={{'model': model, "
                "...}). With Fabric: fabric.load(path, {'model': model, 'optimizer': optimizer, ...}), the model "
                "set up with fabric.setup()."
            )
        path = self._path_to_load(path)
        model_key, model = _the_model(state, "load")
        optimizers = {key: value for key, value in state.items() if isinstance(value, Optimizer)}
        # Another strategy's folder that its package writes as one file with everything (DeepSpeed's ZeRO folders,
        # ColossalAI's sharded ones) loads from that file, written once inside it by rank 0 in the Trainer's layout:
        # read under state's keys.
        one_file = Path(one_file_for(path, self, weights_only, native=(DCP.key,)))
        if one_file == path:
            read_full = checkpoints.checkpoint_io_reader(self.checkpoint_io, weights_only)
        else:
            path = one_file

            def read_full(file: Path) -> dict[str, Any]:
                saved = load_file(file, weights_only, mmap=True, map_location="cpu")
                return as_fabric_layout(saved, model_key, list(optimizers))

        rest = checkpoints.load_into(
            path, model, model_key, optimizers, strict=strict, weights_only=weights_only, read_full=read_full
        )
        missing = [key for key in state if key not in (model_key, *optimizers) and key not in rest]
        if strict and missing:
            raise KeyError(  # Lightning's words, whole: a KeyError's message is shown quoted
                f"The requested state contains a key '{missing[0]}' that does not exist in the loaded checkpoint. "
                "To disable strict loading, set `strict=False`."
            )
        for key in list(state):
            if key in (model_key, *optimizers) or key not in rest:
                continue
            if hasattr(state[key], "load_state_dict"):
                state[key].load_state_dict(rest.pop(key))
            else:
                state[key] = rest.pop(key)
        return without_record(rest, state)

    def _load_raw_module(self, path: Path, module: Module, strict: bool, weights_only: bool | None) -> dict[str, Any]:
        """fabric.load_raw: one file holding the module's full state dict, as torch.save(model.state_dict()) writes."""
        if not path.is_file():
            raise ValueError(
                "Failed to load checkpoint directly into the model. The given path must be a single file containing "
                f"the full state dict: {path}. fabric.load_raw reads one file holding the model's full state dict: "
                "pass that file, or load a checkpoint folder with fabric.load(path, {'model': model})."
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


def _the_model(state: dict[str, Any], action: str) -> tuple[str, Module]:
    """The one sharded model of ``state``, or Lightning's words for none or several (``action``: "save" or
    "load")."""
    from torch.distributed.fsdp import FSDPModule

    models = [(key, value) for key, value in state.items() if isinstance(value, FSDPModule)]
    if not models:
        doing = "saving" if action == "save" else "loading"
        raise ValueError(
            "Could not find a FSDP model in the provided checkpoint state. Please provide the model as part of the "
            f"state like so: `{action}_checkpoint(..., state={{'model': model, ...}})`. Make sure you set up the "
            f"model (and optimizers if any) through the strategy before {doing} the checkpoint. The state's keys: "
            f"{sorted(state)}; the model is the one fabric.setup() returned."
        )
    if len(models) > 1:
        doing = "Saving" if action == "save" else "Loading"
        raise ValueError(
            f"Found multiple FSDP models in the given state. {doing} checkpoints with FSDP is currently limited to a "
            f"single model per checkpoint. To {action} multiple models, call the {action} method for each model "
            f"separately with a different path. Found them under {sorted(key for key, _ in models)}."
        )
    return models[0]


class _FSDPBackwardSyncControl(_BackwardSyncControl):
    """Named as Lightning's, whose name its refusal of a module not set up says."""

    @contextmanager
    @override
    def no_backward_sync(self, module: Module, enabled: bool) -> Any:
        if not enabled:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        if not any(isinstance(submodule, FSDPModule) for submodule in module.modules()):
            raise TypeError(
                "Blocking backward sync is only possible if the module passed to "
                f"`{type(self).__name__}.no_backward_sync` is wrapped in `FullyShardedDataParallel`. Got: "
                f"{type(module).__name__}. Here: sharded by FSDP2's fully_shard, as fabric.setup(module) does."
            )
        with gradient_sync_paused(module):
            yield
