"""DeepSpeed for ``lightning.Fabric``: the same names, parameters and config as the Trainer strategy.

With Fabric the user writes the loop: ``fabric.backward(loss)`` and ``optimizer.step()`` on every
micro-batch go to the engine, and DeepSpeed accumulates over the config's
``gradient_accumulation_steps`` itself. Registered as a virtual subclass of Lightning's Fabric
DeepSpeedStrategy (end of this module), so Fabric's DeepSpeed branches apply to it. What it shares
with the Trainer strategy lives in ``body.py``; this module imports nothing of the Trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.accelerators import CPUAccelerator
from lightning.fabric.plugins.precision import DeepSpeedPrecision as LightningFabricDeepSpeedPrecision
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies.ddp import DDPStrategy
from lightning.fabric.strategies.deepspeed import DeepSpeedStrategy as LightningFabricDeepSpeedStrategy
from lightning_utilities.core.apply_func import apply_to_collection
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_strategies import CheckpointError, constructor_for
from lightning_strategies.checkpoints import (
    as_fabric_layout,
    load_file,
    on_rank_zero,
    one_file_for,
    saved_entry,
    weights_only_keyword,
)
from lightning_strategies.hugging_face import deferred_pretrained_loading, record_models, without_record
from lightning_strategies.precision import fp16_mixed_on_cpu_as_bf16
from lightning_strategies_deepspeed import checkpoint as checkpoints
from lightning_strategies_deepspeed import foreign, universal
from lightning_strategies_deepspeed.body import DTYPES, DeepSpeedBody, check_full_weights_path


# A subclass of Lightning's plugin, as the Trainer's is (precision.py says why). Unlike the Trainer's it keeps
# Lightning's tensor_init_context and module_init_context, so Fabric's init_module() under a `*-true`
# precision creates parameters in that dtype, as Lightning's DeepSpeed plugin does.
class DeepSpeedFabricPrecision(LightningFabricDeepSpeedPrecision):
    """Casts inputs (and, for ``*-true``, the module); the engine does the rest."""

    def __init__(self, precision: str = "32-true") -> None:
        super().__init__(precision)  # type: ignore[arg-type]  # Lightning's refuses the flags DeepSpeed has no dtype for
        self.dtype = DTYPES[self.precision]

    @override
    def convert_module(self, module: Module) -> Module:
        return module.to(dtype=self.dtype) if self.precision.endswith("-true") else module

    @override
    def convert_input(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor, _to_floating_dtype, self.dtype)

    @override
    def convert_output(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor, _to_floating_dtype, torch.get_default_dtype())

    @override
    def backward(self, tensor: torch.Tensor, model: Any, *args: Any, **kwargs: Any) -> None:
        model.backward(tensor, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        return optimizer.step(**kwargs)  # the engine: it steps on the accumulation boundary


# Lightning's words for clipping asked of the Fabric strategy, which ours begin with.
_CLIPPING_IN_THE_CONFIG = (
    "DeepSpeed handles gradient clipping automatically within the optimizer. "
    "Make sure to set the `gradient_clipping` value in your Config."
)


def _to_floating_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if torch.is_floating_point(tensor) else tensor


class DeepSpeedFabricStrategy(DeepSpeedBody, DDPStrategy):
    """Fabric's DeepSpeed strategy; the parameters are those of the Trainer's DeepSpeedStrategy."""

    # The body's constructor under this class's name, which Python's errors for a wrong call then name.
    __init__ = constructor_for(__qualname__, DeepSpeedBody.__init__)
    _own_precision_given = False  # read by the precision setter, which the base constructor calls
    precision_keyword = "precision"

    @override
    def _finish_init(self, precision: Precision | None) -> None:
        self._own_precision_given = precision is not None
        # The engine reduces gradients only on the accumulation boundary its config sets, so there is no
        # reduction to skip: fabric.no_backward_sync then warns and goes on, as with Lightning's DeepSpeed.
        self._backward_sync_control = None
        self._engine: Any = None

    @property  # type: ignore[explicit-override]  # mypy#15900: a property with a setter never counts as marked
    @override
    def precision(self) -> Precision:
        return self._precision if self._precision is not None else DeepSpeedFabricPrecision()

    @precision.setter
    def precision(self, precision: Precision | None) -> None:
        if self._own_precision_given and self._precision is not None:
            return
        if precision is not None and not isinstance(precision, DeepSpeedFabricPrecision):
            flag = getattr(precision, "precision", "32-true")
            precision = DeepSpeedFabricPrecision(
                fp16_mixed_on_cpu_as_bf16(flag, isinstance(self.accelerator, CPUAccelerator))
            )
        self._precision = precision

    @property
    def model(self) -> Any:
        """The engine: Fabric's optimizer wrapper steps through it."""
        return self._engine

    @property
    def _deepspeed_engine(self) -> Any:
        """The name Fabric's backward uses: it points this at the engine of ``fabric.backward(loss, model=...)``."""
        return self._engine

    @_deepspeed_engine.setter
    def _deepspeed_engine(self, engine: Any) -> None:
        self._engine = engine

    @override
    def _setup_distributed(self) -> None:
        self._check_devices()
        super()._setup_distributed()
        self._attach_deepspeed()
        if not self._config_completed:
            # The user's loop owns batch size and accumulation: DeepSpeed's config decides them.
            self._complete_config(self.precision.precision, accumulation=1, micro_batch_size=1)

    @override
    def setup_module_and_optimizers(self, module: Module, optimizers: list[Optimizer], scheduler: Any = None) -> Any:
        if len(optimizers) != 1:
            raise ValueError(
                f"Currently only one optimizer is supported with DeepSpeed. Got {len(optimizers)} optimizers instead. "
                "Set up each model with its one optimizer: fabric.setup(model, optimizer)."
            )
        self._finish_partitioned_models(module)
        engine, optimizer, _, scheduler = self._initialize_engine(module, optimizers[0], scheduler)
        self._engine = engine
        return engine, [optimizer], scheduler

    @override
    def setup_module(self, module: Module) -> Any:
        self._finish_partitioned_models(module)
        self._engine = self._initialize_evaluation_engine(module)
        return self._engine

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        raise NotImplementedError(
            "The `DeepSpeedStrategy` does not support setting up the module and optimizer(s) independently. Please "
            "call `setup_module_and_optimizers(model, [optimizer, ...])` to jointly set them up. With Fabric: use "
            "fabric.setup(model, optimizer)."
        )

    @override
    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager:
        self._refuse_eager_init_under_zero_3(empty_init)
        stack = ExitStack()
        if not self.zero_stage_3:
            stack.enter_context(super().module_init_context(empty_init=empty_init))
        stack.enter_context(self.module_sharded_context())
        return stack

    def module_sharded_context(self) -> AbstractContextManager:
        if not self.zero_stage_3:
            return nullcontext()
        stack = ExitStack()
        stack.enter_context(deferred_pretrained_loading(type(self).__name__, initialize_later=True))
        stack.enter_context(self._partitioned_init(self.config))
        return stack

    @override
    def backward(self, tensor: torch.Tensor, module: Any, *args: Any, **kwargs: Any) -> None:
        engine = module if hasattr(module, "backward") and hasattr(module, "step") else self._engine
        if engine is None:
            raise RuntimeError("No model was set up for backward: call fabric.setup(model, optimizer) first.")
        self._engine = engine  # the optimizer wrapper steps the engine that did the backward
        self.precision.backward(tensor, engine, *args, **kwargs)

    @override
    def clip_gradients_norm(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError(
            f"{_CLIPPING_IN_THE_CONFIG} DeepSpeed clips inside its step: pass "
            "DeepSpeedStrategy(config={..., 'gradient_clipping': max_norm})."
        )

    @override
    def clip_gradients_value(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"{_CLIPPING_IN_THE_CONFIG} DeepSpeed clips by the gradients' global norm only, not by value."
        )

    @override
    def save_checkpoint(
        self, path: Any, state: dict[str, Any], storage_options: Any = None, filter: dict[str, Callable] | None = None
    ) -> None:
        """One DeepSpeed checkpoint directory at ``path``; the non-module entries of ``state`` travel inside."""
        if storage_options is not None:
            raise TypeError(
                "`DeepSpeedStrategy.save_checkpoint(..., storage_options=...)` is not supported because "
                "`DeepSpeedStrategy` does not use the `CheckpointIO`. DeepSpeed writes its own files."
            )
        if filter is not None:
            raise TypeError(
                "`DeepSpeedStrategy.save_checkpoint(..., filter=...)` is not supported because `DeepSpeedStrategy` "
                "manages the state serialization internally. DeepSpeed writes its own files."
            )
        engine = _single_engine(state, "save")
        client_state = {
            key: value
            for key, value in state.items()
            if not isinstance(value, (Module, Optimizer)) and not _is_deepspeed_optimizer(value)
        }
        # The engine's weights are read back under their own names (no state key): the record sits at the root.
        record_models(client_state, engine.module)
        self._save_engine(engine, path, client_state)

    @override
    def load_checkpoint(
        self, path: Any, state: Any = None, strict: bool = True, weights_only: bool | None = None
    ) -> dict[str, Any]:
        path = self._recover_checkpoint(path)
        if isinstance(state, (Module, Optimizer)) or self.load_full_weights:
            check_full_weights_path(path)
            return super().load_checkpoint(path=path, state=state, strict=strict, **weights_only_keyword(weights_only))
        if not state:
            raise ValueError(
                f"Got DeepSpeedStrategy.load_checkpoint(..., state={state!r}) but a state with at least  a model "
                "instance to reload is required. Pass it in like so: DeepSpeedStrategy.load_checkpoint(..., "
                "state={'model': model, ...}). With Fabric: fabric.load(path, {'model': model, 'optimizer': "
                "optimizer, ...})."
            )
        # Decided by rank 0 for all, as under the Trainer: a node that does not see the path takes the same load.
        if on_rank_zero(self, lambda: foreign.is_foreign(path)):
            return self._load_foreign(path, state, strict, weights_only)
        # The path is checked before the state, as by Lightning's strategy, so the same mistake gets the same error.
        location, layout = checkpoints.inspect(path, weights_only)
        engine = _single_engine(state, "load")
        if checkpoints.saved_with_the_other_zero(location, layout, bool(engine.zero_optimization_partition_weights())):
            return self._load_foreign(path, state, strict, weights_only, trainer_layout=True)
        wants_optimizer = bool(_optimizer_keys(state))
        with universal.resume_anywhere(self, location, layout, wants_optimizer, weights_only) as (location, layout):
            client_state = checkpoints.load_into_engine(
                engine, location, layout, self.world_size,
                load_optimizer_states=wants_optimizer, weights_only=weights_only, strict=strict,
            )  # fmt: skip
        return _restored(state, client_state)

    def _load_foreign(
        self, path: Any, state: dict[str, Any], strict: bool, weights_only: bool | None, trainer_layout: bool = False
    ) -> dict[str, Any]:
        """What another strategy's ``fabric.save`` wrote (``foreign``), in its one-file form: the weights and
        optimizer states through DeepSpeed's universal layout where ``state`` holds an optimizer, else the weights.
        ``trainer_layout``: the one-file form holds them in the Trainer's layout (a ZeRO folder's, whoever saved it)."""
        engine = _single_engine(state, "load")
        model_key = next(key for key, value in state.items() if value is engine)
        optimizer_keys = _optimizer_keys(state)
        if len(optimizer_keys) > 1:  # before the conversion below, which may take minutes
            raise ValueError(
                f"The state to load holds several optimizers ({', '.join(map(repr, optimizer_keys))}), but a DeepSpeed "
                "engine has one. Keep only the optimizer returned by fabric.setup(model, optimizer) in the state."
            )
        if not optimizer_keys:
            saved = load_file(one_file_for(path, self, weights_only), weights_only, map_location="cpu", mmap=True)
            if trainer_layout:
                saved = as_fabric_layout(saved, model_key, [])
            weights = saved_entry(saved, model_key)  # refused by name before the engine is touched
            self._load_whole_weights(engine.module, engine.optimizer, weights, strict)
            return _restored(state, {key: value for key, value in saved.items() if key != model_key})
        (optimizer_key,) = optimizer_keys
        keys = None if trainer_layout else (model_key, optimizer_key)

        def check(full: Path) -> None:
            if not foreign.holds_optimizer_states(full, weights_only, keys):
                raise CheckpointError(
                    f"{path} holds no optimizer state under {optimizer_key!r}, so the optimizer would start afresh. "
                    f"To agree, load without it: fabric.load(path, {{{model_key!r}: model}}); to go on with the saved "
                    "run's optimizer, load a checkpoint saved with it."
                )

        with foreign.universal_form(self, path, weights_only, check, keys) as target:
            location, layout = checkpoints.inspect(target, weights_only)
            client_state = checkpoints.load_into_engine(
                engine, location, layout, self.world_size,
                load_optimizer_states=True, weights_only=weights_only, strict=strict,
            )  # fmt: skip
        return _restored(state, client_state)


def _optimizer_keys(state: dict[str, Any]) -> list[str]:
    return [key for key, value in state.items() if isinstance(value, Optimizer) or _is_deepspeed_optimizer(value)]


def _restored(state: dict[str, Any], client_state: dict[str, Any]) -> dict[str, Any]:
    """Put what was saved under the keys of ``state`` that are not the model or optimizer into ``state``; return the
    entries of ``client_state`` that ``state`` did not ask for, as Fabric's load returns them."""
    for key in list(state):
        if key in client_state and not isinstance(state[key], (Module, Optimizer)):
            value = client_state.pop(key)
            if hasattr(state[key], "load_state_dict") and isinstance(value, dict):
                state[key].load_state_dict(value)
            else:
                state[key] = value
    remainder = {key: value for key, value in client_state.items() if key not in ("optimizer", "lr_scheduler")}
    return without_record(remainder, state)


# Fabric checks for its DeepSpeed strategy by class in backward (which engine a loss belongs to), in
# setup_optimizers (refused: the engine needs model and optimizer together) and in its connector (the
# precision plugin). ABC registration makes isinstance() true without inheriting its constructor.
LightningFabricDeepSpeedStrategy.register(DeepSpeedFabricStrategy)


def _is_deepspeed_optimizer(value: Any) -> bool:
    return type(value).__module__.startswith("deepspeed.") and hasattr(value, "step") and not isinstance(value, Module)


def _single_engine(state: dict[str, Any], action: str) -> Any:
    """The one engine of ``state``, or Lightning's words for none or several (``action``: "save" or "load")."""
    from deepspeed import DeepSpeedEngine

    engines = [value for value in state.values() if isinstance(value, DeepSpeedEngine)]
    if not engines:
        doing = "saving" if action == "save" else "loading"
        raise ValueError(
            "Could not find a DeepSpeed model in the provided checkpoint state. Please provide the model as part of "
            f"the state like so: `{action}_checkpoint(..., state={{'model': model, ...}})`. Make sure you set up the "
            f"model (and optimizers if any) through the strategy before {doing} the checkpoint."
        )
    if len(engines) > 1:
        if action == "save":
            raise ValueError(
                "Found multiple DeepSpeed engine modules in the given state. Saving checkpoints with DeepSpeed is "
                "currently limited to a single model per checkpoint. To save multiple models, call the save method "
                "for each model separately with a different path."
            )
        raise ValueError(
            "Found multiple DeepSpeed engine modules in the given state. Saving and loading checkpoints with "
            "DeepSpeed is currently limited to a single model per checkpoint. To load multiple model states, call "
            "the load method for each model checkpoint separately."
        )
    return engines[0]
