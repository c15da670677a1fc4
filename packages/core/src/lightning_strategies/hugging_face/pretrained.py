"""``from_pretrained`` inside ``configure_model``: the model is built from its config in the strategy's init context
(meta device, ZeRO-3 partitions, lazy tensors) and its weights are read into each shard once the model is sharded.

``transformers`` loads weights at once, into the whole model, on every rank (and refuses the meta device). Inside
``deferred_pretrained_loading()`` it instead records where each weight is (``PretrainedWeights``); the strategy
calls ``load_pending`` once the model is sharded, and each rank reads only its part of the safetensors files.
A PEFT adapter loaded there (``PeftModel.from_pretrained(base, folder)``) is recorded the same way: PEFT names
each weight of the adapter's file after the model's parameters, and the strategy reads it into the shards.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _lightning_strategies_autoload import ImportWatcher

from lightning_strategies.errors import CapabilityError, CheckpointError
from lightning_strategies.hugging_face.models import hugging_face_models, transformers_installed

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# safetensors' dtype names, as torch names them.
SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool",
}  # fmt: skip
# from_pretrained arguments that say where the files are, as opposed to how to build the model.
HUB_ARGUMENTS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")
# from_pretrained arguments that place, transform or add to the weights as they load, which a model whose weights the
# strategy reads into its shards cannot honour: each is refused with what to do instead.
REFUSED_ARGUMENTS = {
    "adapter_kwargs": "that folder holds a PEFT adapter: load its base model here and the adapter onto it, "
    "peft.PeftModel.from_pretrained(base_model, adapter_folder, is_trainable=True), which the strategy reads into "
    "its shards (where it trains PEFT models). To go on from a run's checkpoint, Trainer.fit(ckpt_path=...) also "
    "carries the optimizer states",
    "key_mapping": "save the model once with its keys renamed (from_pretrained then save_pretrained) and load that",
    "output_loading_info": "the strategy reports weights the checkpoint lacks as it reads them; drop the argument",
    "device_map": "the strategy places every shard; drop device_map",
    "tp_plan": "the strategy shards the model; drop tp_plan",
    "quantization_config": "quantized models are not sharded by these strategies; load it with strategy='ddp'",
    "load_in_8bit": "quantized models are not sharded by these strategies; load it with strategy='ddp'",
    "load_in_4bit": "quantized models are not sharded by these strategies; load it with strategy='ddp'",
    "state_dict": "pass the folder the weights were saved to with save_pretrained instead of a state_dict",
    "gguf_file": "convert the GGUF file to safetensors with save_pretrained first",
}
# Where PEFT moves a layer's weights when it wraps the layer: an adapted layer under "base_layer"
# (peft.tuners.tuners_utils.BaseTunerLayer), a layer trained beside the adapter (modules_to_save) under
# "original_module", with its trained copy under "modules_to_save.<adapter>" (peft.utils.other.ModulesToSaveWrapper).
PEFT_WRAPPERS = re.compile(r"\.(base_layer|original_module|modules_to_save\.[^.]+)\.")
# Weights of models built inside deferred_pretrained_loading(), until their strategy loads them. Weak, so a model
# that is dropped takes its entry with it.
_pending: weakref.WeakKeyDictionary[Any, list[PretrainedWeights]] = weakref.WeakKeyDictionary()
# Models whose Hugging Face initialisation was skipped at construction (initialize_later), until it is run.
_initialization_deferred: weakref.WeakSet[Any] = weakref.WeakSet()


# -- where the weights are -------------------------------------------------------------------------------------


@dataclass
class PretrainedWeights:
    """Where each weight of a model built by ``from_pretrained`` inside ``deferred_pretrained_loading`` is.

    ``files`` maps a checkpoint key to its safetensors file; ``names`` maps the model's own state-dict names to
    checkpoint keys (a checkpoint may be saved with or without the base model's prefix). Names absent from
    ``names`` are initialised as ``from_pretrained`` would: Hugging Face's initialisation.

    A PEFT adapter's weights (``adapter``) are named by the adapted model's own state-dict names, as PEFT names
    them when it loads the adapter.
    """

    source: str
    files: dict[str, Path]
    names: dict[str, str]
    adapter: bool = False
    _handles: dict[Path, Any] = field(default_factory=dict, repr=False)

    def read(self, name: str, index: tuple[slice, ...] | None = None) -> torch.Tensor:
        """The weight of the model's ``name``, or the part of it that ``index`` selects (only those bytes are read)."""
        key = self.names[name]
        handle = self._open(self.files[key])
        if index is None:
            return handle.get_tensor(key)
        return handle.get_slice(key)[index]

    def _open(self, path: Path) -> Any:
        from safetensors import safe_open

        if path not in self._handles:
            self._handles[path] = safe_open(str(path), framework="pt")
        return self._handles[path]

    def close(self) -> None:
        self._handles.clear()


def pending_weights(root: nn.Module) -> list[tuple[str, nn.Module, PretrainedWeights]]:
    """``(prefix, model, weights)`` for every model in ``root`` whose pretrained weights are still to be read; the
    model's state-dict names are ``prefix`` + its own. Each is handed out once, adapters after the models they adapt:
    a base model's weights also start the copies an adapter trains (``modules_to_save``), which the adapter's own
    weights then replace."""
    found = []
    for prefix, module in root.named_modules():
        for weights in _pending.pop(module, []):
            found.append((f"{prefix}." if prefix else "", module, weights))
    return sorted(found, key=lambda entry: entry[2].adapter)


def pretrained_tensors(root: nn.Module) -> Iterator[tuple[Any, PretrainedWeights, str]]:
    """``(tensor, weights, original)`` for each of ``root``'s parameters and buffers whose pretrained value is still
    to be read, as ``weights.read(original)``. Each is handed out once, and every weight of the checkpoint the model
    takes must find its tensor (a wrapper that renames them otherwise leaves them silently unread); the files are
    closed when the iteration ends (a later read opens them again)."""
    for _, model, weights in pending_weights(root):
        found: set[str] = set()
        try:
            for own_name, tensor in model.state_dict(keep_vars=True).items():
                # An adapter's weights go by their own names; a base model's by those before PEFT wrapped its layers.
                original = own_name if weights.adapter else PEFT_WRAPPERS.sub(".", own_name)
                if original in weights.names:
                    found.add(original)
                    yield tensor, weights, original
        finally:
            weights.close()
        unread = sorted(set(weights.names) - found)
        shown = f"{', '.join(unread[:3])}{', ...' if len(unread) > 3 else ''}"
        if unread and weights.adapter:
            raise CheckpointError(
                f"PeftModel.from_pretrained(..., {weights.source!r}): {len(unread)} weight(s) of the adapter found no "
                f"parameter of the model ({shown}): the adapter was merged or deleted after it was loaded in "
                "configure_model, before its weights were read. Merge it after training (lightning-strategies "
                "export, then merge_and_unload), or load a model saved merged."
            )
        if unread:
            raise CheckpointError(
                f"from_pretrained({weights.source!r}): {len(unread)} weight(s) of the checkpoint found no parameter "
                f"of the model ({shown}): something renamed them after from_pretrained. Build the model with "
                "from_pretrained and wrap it afterwards only with PEFT."
            )


def load_pending(root: nn.Module, write: Callable[[Any, PretrainedWeights, str], None]) -> None:
    """``write(tensor, weights, original)`` for each of ``pretrained_tensors(root)``."""
    for tensor, weights, original in pretrained_tensors(root):
        write(tensor, weights, original)


def _checkpoint_files(source: str, hub: dict[str, Any]) -> dict[str, Path]:
    """Checkpoint key -> safetensors file, for a folder saved with ``save_pretrained`` or a cached hub model."""
    subfolder = hub.get("subfolder") or ""
    folder = Path(source) / subfolder
    if folder.is_dir():
        index, single = folder / SAFETENSORS_INDEX, folder / SAFETENSORS
        found_index = index if index.is_file() else None
        found_single = single if single.is_file() else None
    elif Path(source).exists():
        raise CheckpointError(
            f"from_pretrained({source!r}): {source} is a file; pass the folder that save_pretrained wrote "
            f"(it holds config.json and {SAFETENSORS} or {SAFETENSORS_INDEX})."
        )
    else:
        found_index = _cached(source, SAFETENSORS_INDEX, hub)
        found_single = None if found_index else _cached(source, SAFETENSORS, hub)
    if found_index is not None:
        return _indexed_files(source, found_index)
    if found_single is not None:
        return dict.fromkeys(_keys(source, found_single), found_single)
    legacy = [name for name in ("pytorch_model.bin", "pytorch_model.bin.index.json") if (folder / name).exists()]
    hint = (
        f"It holds {legacy[0]} (pickled weights), which cannot be read a shard at a time: load it once with "
        "transformers and save_pretrained it again (safetensors is the default), then point from_pretrained there."
        if legacy
        else "Save the model with save_pretrained (safetensors is the default), or check the path."
    )
    raise CheckpointError(f"from_pretrained({source!r}) found no {SAFETENSORS} nor {SAFETENSORS_INDEX}. {hint}")


def _cached(source: str, filename: str, hub: dict[str, Any]) -> Path | None:
    """A file of a hub model, from the local cache or the hub (as transformers resolves it), or None."""
    from transformers.utils import cached_file

    try:
        quietly = {"_raise_exceptions_for_missing_entries": False, "_raise_exceptions_for_connection_errors": False}
        resolved = cached_file(source, filename, **quietly, **hub)
    except OSError as error:  # an unknown model id, or no network and nothing cached
        raise CheckpointError(
            f"from_pretrained({source!r}): not a local folder, and the hub could not provide it ({error}). Pass the "
            "folder save_pretrained wrote, or download the model first (huggingface-cli download)."
        ) from error
    return Path(resolved) if resolved else None


def _indexed_files(source: str, index: Path) -> dict[str, Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError) as error:
        raise CheckpointError(
            f"from_pretrained({source!r}): {index} is not a safetensors index ({error!r}); it may be half written. "
            "Save the model again with save_pretrained."
        ) from error
    files = {key: index.parent / name for key, name in weight_map.items()}
    absent = sorted({path.name for path in files.values() if not path.is_file()})
    if absent:
        raise CheckpointError(
            f"from_pretrained({source!r}): {index.name} lists {len(absent)} file(s) that are not there "
            f"({', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''}): the save was cut short or the files were "
            "moved. Save the model again with save_pretrained, or copy the missing files next to the index."
        )
    for path in sorted(set(files.values())):
        _keys(source, path)  # every file's header must read
    return files


def _keys(source: str, path: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except Exception as error:  # safetensors raises its own SafetensorError for a bad header or a short file
        raise CheckpointError(
            f"from_pretrained({source!r}): {path} cannot be read ({error}); it is damaged or was not written to the "
            "end. Save the model again with save_pretrained."
        ) from error


def match_names(model: nn.Module, files: dict[str, Path], source: str, ignore_mismatched: bool) -> PretrainedWeights:
    """Pair the model's state-dict names with checkpoint keys and check their shapes, before any memory is
    allocated: a config that contradicts the checkpoint is refused here, not after the model is sharded."""
    from safetensors import safe_open

    prefix = getattr(model, "base_model_prefix", "") or ""
    tied_keys = getattr(model, "all_tied_weights_keys", None)  # {} for an untied model: not the class's default
    tied = set(tied_keys if tied_keys is not None else getattr(model, "_tied_weights_keys", None) or ())
    own = dict(model.state_dict(keep_vars=True))
    names: dict[str, str] = {}
    missing: list[str] = []
    for name in own:
        candidates = [name]
        if prefix:
            candidates += [name.removeprefix(f"{prefix}."), f"{prefix}.{name}"]
        key = next((candidate for candidate in candidates if candidate in files), None)
        if key is None:
            if name not in tied:
                missing.append(name)
            continue
        names[name] = key
    shapes: dict[str, tuple[int, ...]] = {}
    for path in set(files.values()):
        with safe_open(str(path), framework="pt") as handle:
            shapes.update((key, tuple(handle.get_slice(key).get_shape())) for key in handle.keys())  # noqa: SIM118
    mismatched = []
    for name, key in list(names.items()):
        shape, expected = shapes[key], tuple(_full_shape(own[name]))
        if shape != expected:
            mismatched.append(f"{name}: checkpoint {list(shape)}, model {list(expected)}")
            if ignore_mismatched:
                del names[name]
                missing.append(name)
    if mismatched and not ignore_mismatched:
        shown = "; ".join(mismatched[:4]) + ("; ..." if len(mismatched) > 4 else "")
        raise CheckpointError(
            f"from_pretrained({source!r}): {len(mismatched)} weight(s) of the checkpoint do not fit the model its "
            f"config builds ({shown}). Pass the config the checkpoint was saved with, or ignore_mismatched_sizes=True "
            "to initialise those weights afresh."
        )
    unexpected = set(files) - set(names.values())
    if unexpected:
        log.info("from_pretrained(%r): %d checkpoint weight(s) unused by the model", source, len(unexpected))
    if missing:
        log.warning(
            "Some weights of %s were not in the checkpoint at %s and are newly initialised: %s",
            type(model).__name__, source, missing,
        )  # fmt: skip
    return PretrainedWeights(source, files, names)


def _full_shape(tensor: Any) -> Any:
    return getattr(tensor, "ds_shape", tensor.shape)  # a ZeRO-3 partition keeps its whole shape beside it


# -- from_pretrained inside configure_model ----------------------------------------------------------------------


@contextlib.contextmanager
def deferred_pretrained_loading(strategy: str, initialize_later: bool = False, adapters: bool = True) -> Iterator[None]:
    """Inside, ``PreTrainedModel.from_pretrained`` builds the model from its config in the surrounding init context
    and records where its weights are; the strategy named ``strategy`` reads them into its shards (``load_pending``).

    With ``initialize_later``, models built inside also skip Hugging Face's initialisation at construction (their
    layers' own still runs, and tied weights are tied), for a strategy that initialises them once they are sharded:
    under ZeRO-3 each rank holds an empty placeholder then, which ``_init_weights`` cannot index.

    With ``adapters``, a PEFT adapter loaded inside (``PeftModel.from_pretrained``) is kept for the strategy too;
    a strategy that refuses PEFT models passes False.

    The patches on ``transformers`` and peft last exactly as long as the context: nothing outlives the hook it wraps.
    Contexts nest; they are the process's, so two open at once in two threads are not supported.
    """
    if not _transformers_5_installed():
        yield
        return

    def from_pretrained(
        cls: type, pretrained_model_name_or_path: str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> Any:
        return _build_deferred(cls, os.fspath(pretrained_model_name_or_path), args, kwargs, strategy)

    def tie_weights_only(self: Any) -> None:
        _initialization_deferred.add(self)
        self.tie_weights(recompute_mapping=False)

    def refusing_transformers_adapters(self: Any, source: Any = None, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{type(self).__name__}.load_adapter({source!r}) inside configure_model under {strategy}: "
            "transformers loads the adapter into the model as built here, placeholders the strategy fills later, "
            "so it would be lost. Load it with peft.PeftModel.from_pretrained(model, adapter_folder, "
            "is_trainable=True), which the strategy reads into its shards."
        )

    def patch_models(modeling_utils: Any) -> None:
        _replace(stack, modeling_utils.PreTrainedModel, "from_pretrained", lambda _: classmethod(from_pretrained))
        if initialize_later:
            _replace(stack, modeling_utils.PreTrainedModel, "init_weights", lambda _: tie_weights_only)
        if adapters:
            _replace(stack, modeling_utils.PeftAdapterMixin, "load_adapter", lambda _: refusing_transformers_adapters)

    def patch_auto_classes(modeling_auto: Any) -> None:
        # The Auto classes look in the folder (for an adapter's config, then the model's) before the model class's
        # from_pretrained is reached, and transformers answers a missing one about hub repository names.
        for auto_class in _auto_model_classes():
            _replace(
                stack,
                auto_class,
                "from_pretrained",
                lambda original: _refusing_missing_folder(original, "pretrained_model_name_or_path", 0),
            )

    def refusing_xlora(self: Any, *args: Any, **kwargs: Any) -> None:
        raise CapabilityError(
            f"PEFT's XLoRA inside configure_model under {strategy}: it reads its adapters' weights as it is built, "
            "into placeholders the strategy fills later from the base model's files alone, so the adapters would "
            "start from nothing. Train XLoRA with strategy='ddp'."
        )

    def patch_peft(peft: Any) -> None:
        _replace(stack, peft.PeftModel, "load_adapter", lambda original: _deferring_adapter_loads(original, strategy))
        _replace(stack, peft.XLoraModel, "__init__", lambda _: refusing_xlora)
        # PEFT tries a missing folder as a hub id before it says the folder has no adapter_config.json.
        _replace(
            stack,
            peft.PeftModel,
            "from_pretrained",
            lambda original: _refusing_missing_folder(original, "model_id", 1, adapter=True),
        )

    # Each module is patched where it is imported already, or as a hook imports it: importing them here would add
    # seconds to every set-up (transformers' models about 2 s, peft about 3 s on two cores), whatever the model.
    with contextlib.ExitStack() as stack:
        stack.enter_context(_when_imported("transformers.modeling_utils", patch_models))
        stack.enter_context(_when_imported("transformers.models.auto.modeling_auto", patch_auto_classes))
        if adapters:
            stack.enter_context(_when_imported("peft", patch_peft))
        yield


def _replace(stack: contextlib.ExitStack, owner: type, name: str, make: Callable[[Any], Any]) -> None:
    """Sets ``owner.name`` to ``make(its own value)`` until ``stack`` closes."""
    original = owner.__dict__[name]
    setattr(owner, name, make(original))
    stack.callback(setattr, owner, name, original)


@contextlib.contextmanager
def _when_imported(name: str, patch: Callable[[Any], None]) -> Iterator[None]:
    """Runs ``patch(module)`` on the module ``name`` now where it is imported, else as soon as it is imported
    inside (when its ``__init__`` has run); does nothing where it is never imported."""
    if sys.modules.get(name) is not None:  # None: the module is hidden, and its import fails as it would without us
        patch(importlib.import_module(name))  # which waits for another thread still importing it
        yield
        return
    open_ = True

    def patch_while_open(module: Any) -> None:
        if open_:  # an import another thread began inside may end after the context
            patch(module)

    watcher = ImportWatcher({name}, patch_while_open)
    sys.meta_path.insert(0, watcher)
    try:
        yield
    finally:
        open_ = False
        sys.meta_path.remove(watcher)


def _refusing_missing_folder(original: classmethod, argument: str, position: int, adapter: bool = False) -> classmethod:
    """The classmethod ``original``, first refusing a folder that does not exist (its ``argument``, the
    ``position``-th after the class) in our words, before transformers or PEFT try it as a hub id."""

    def checked(cls: type, *args: Any, **kwargs: Any) -> Any:
        source = args[position] if len(args) > position else kwargs.get(argument)
        if isinstance(source, (str, os.PathLike)):
            _refuse_missing_folder(os.fspath(source), adapter)
        return original.__func__(cls, *args, **kwargs)

    return classmethod(checked)


def _auto_model_classes() -> list[type]:
    """The Auto model classes (AutoModel, AutoModelForCausalLM, ...), once transformers' modeling_auto is imported:
    transformers gives each a copy of its base class's from_pretrained, so each is patched apart."""
    found: list[type] = []
    pending = [sys.modules["transformers.models.auto.auto_factory"]._BaseAutoModelClass]
    while pending:
        auto_class = pending.pop()
        pending.extend(auto_class.__subclasses__())
        if "from_pretrained" in auto_class.__dict__:
            found.append(auto_class)
    return found


def _deferring_adapter_loads(original: Callable[..., Any], strategy: str) -> Callable[..., Any]:
    """``PeftModel.load_adapter`` (which ``PeftModel.from_pretrained`` calls) as PEFT has it, but for the weights:
    PEFT reads only the header of the adapter's safetensors file (each tensor on the meta device: inside the
    strategy's init context, tensors made there would be its placeholders) and names each after the model's
    parameters; the strategy then reads the file into its shards (``PretrainedWeights`` with ``adapter``)."""
    from torch.nn.modules.module import _IncompatibleKeys

    save_and_load: Any = importlib.import_module("peft.utils.save_and_load")

    def load_adapter(self: Any, model_id: Any, *args: Any, **kwargs: Any) -> Any:
        source = os.fspath(model_id)
        if kwargs.get("low_cpu_mem_usage"):
            raise TypeError(
                f"PeftModel.from_pretrained(..., {source!r}, low_cpu_mem_usage=True) inside configure_model under "
                f"{strategy}: the strategy builds the adapter in its shards and reads its weights into "
                "them; drop low_cpu_mem_usage."
            )
        if not kwargs.get("is_trainable", args[1] if len(args) > 1 else False):
            log.warning(
                "PeftModel.from_pretrained(..., %r) in configure_model loads the adapter frozen (PEFT's default, for "
                "inference): pass is_trainable=True to train it on.", source
            )  # fmt: skip
        ignore_mismatched = bool(kwargs.pop("ignore_mismatched_sizes", False))
        # id of each header tensor -> its key, file and the tensor (kept alive, so that no id is reused)
        where: dict[int, tuple[str, Path, Any]] = {}
        loaded: dict[str, Any] = {}

        def read_header(filename: str, device: Any = None) -> dict[str, Any]:
            tensors = _header_tensors(source, Path(filename))
            where.update((id(tensor), (key, Path(filename), tensor)) for key, tensor in tensors.items())
            return tensors

        def refuse_pickle(filename: str, *_: Any, **__: Any) -> Any:
            raise CheckpointError(
                f"PeftModel.from_pretrained(..., {source!r}): the adapter is saved as {Path(filename).name} (pickled), "
                "which cannot be read a shard at a time. Load it once with peft and save_pretrained it again "
                "(safetensors is the default), then load that folder."
            )

        def keep(state_dict: dict[str, Any], strict: bool = True, assign: bool = False) -> Any:
            loaded.update(state_dict)
            own = self.state_dict(keep_vars=True)  # with the adapter load_adapter added, if it added one
            return _IncompatibleKeys([name for name in own if name not in state_dict],
                                     [name for name in state_dict if name not in own])  # fmt: skip

        readers = save_and_load.safe_load_file, save_and_load.torch_load
        save_and_load.safe_load_file, save_and_load.torch_load = read_header, refuse_pickle
        self.load_state_dict = keep  # what PEFT's set_peft_model_state_dict loads the adapter with
        try:
            result = original(self, model_id, *args, **kwargs)
        finally:
            save_and_load.safe_load_file, save_and_load.torch_load = readers
            self.__dict__.pop("load_state_dict", None)
        _refuse_prompt_learning(self, source)
        _defer_adapter(self, source, loaded, where, ignore_mismatched)
        return result

    return load_adapter


def _refuse_prompt_learning(model: Any, source: str) -> None:
    """Prompt-learning adapters (prefix tuning, prompt tuning) load their embeddings themselves, past PEFT's
    ``load_state_dict``, so the strategy could not read them into its shards."""
    if any(config.is_prompt_learning for config in model.peft_config.values()):
        raise TypeError(
            f"PeftModel.from_pretrained(..., {source!r}) inside configure_model: a prompt-learning adapter "
            "(prefix or prompt tuning) loads its embeddings itself, which the strategy cannot read into its shards. "
            "Train it with strategy='ddp', or use a LoRA adapter."
        )


def _header_tensors(source: str, path: Path) -> dict[str, Any]:
    """Each tensor of a safetensors file as an empty tensor of its shape and dtype on the meta device."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            slices = {key: handle.get_slice(key) for key in handle.keys()}  # noqa: SIM118
            header = {key: (piece.get_shape(), piece.get_dtype()) for key, piece in slices.items()}
    except Exception as error:  # safetensors raises its own SafetensorError for a bad header or a short file
        raise CheckpointError(
            f"PeftModel.from_pretrained(..., {source!r}): {path} cannot be read ({error}); it is damaged or was not "
            "written to the end. Save the adapter again with save_pretrained."
        ) from error
    return {key: torch.empty(shape, dtype=_torch_dtype(dtype), device="meta") for key, (shape, dtype) in header.items()}


def _defer_adapter(
    model: Any, source: str, loaded: dict[str, Any], where: dict[int, tuple[str, Path, Any]], ignore_mismatched: bool
) -> None:
    """Record where each adapter weight PEFT named is, refusing any that do not fit the model PEFT adapted (names
    the model lacks PEFT reports as unexpected). The record is the adapted transformers model's, so that it
    outlives the PeftModel around it (``get_base_model()``)."""
    own = dict(model.state_dict(keep_vars=True))
    loaded = {name: value for name, value in loaded.items() if name in own}
    made = sorted(name for name, value in loaded.items() if id(value) not in where)
    if made:
        raise CheckpointError(
            f"PeftModel.from_pretrained(..., {source!r}): {len(made)} weight(s) of the adapter are computed from "
            f"its file as it loads ({', '.join(made[:3])}{', ...' if len(made) > 3 else ''}), which the strategy "
            "cannot read into its shards. Load the adapter onto the base model with strategy='ddp', merge it "
            "(merge_and_unload) and save_pretrained that model, then fine-tune from it."
        )
    mismatched = {
        name: f"{name}: adapter {list(value.shape)}, model {list(_full_shape(own[name]))}"
        for name, value in loaded.items()
        if tuple(value.shape) != tuple(_full_shape(own[name]))
    }
    if mismatched and not ignore_mismatched:
        shown = "; ".join(list(mismatched.values())[:4]) + ("; ..." if len(mismatched) > 4 else "")
        raise CheckpointError(
            f"PeftModel.from_pretrained(..., {source!r}): {len(mismatched)} weight(s) of the adapter do not fit the "
            f"model ({shown}). Load the base model the adapter was trained on (its adapter_config.json names it), or "
            "pass ignore_mismatched_sizes=True to initialise those weights afresh."
        )
    if mismatched:
        log.warning("Some weights of the adapter at %s do not fit the model and are newly initialised: %s",
                    source, list(mismatched.values()))  # fmt: skip
    found = {name: where[id(value)] for name, value in loaded.items() if name not in mismatched}
    adapted, prefix = model.get_base_model(), "base_model.model."
    if not all(name.startswith(prefix) for name in found):
        adapted, prefix = model, ""
    names = {name.removeprefix(prefix): key for name, (key, _, _) in found.items()}
    files = {key: path for key, path, _ in found.values()}
    _pending.setdefault(adapted, []).append(PretrainedWeights(source, files, names, adapter=True))


def _transformers_5_installed() -> bool:
    """Whether transformers 5 is installed (told without importing it); where an older one is, a line says that
    from_pretrained is left as it has it: what is patched here is the API of 5."""
    if not transformers_installed():
        return False
    import importlib.metadata

    version = importlib.metadata.version("transformers")
    if int(version.split(".")[0]) < 5:
        log.warning(
            "transformers %s is installed; from_pretrained inside configure_model is read into shards from "
            "transformers 5 on (pip install -U transformers), and is left as transformers has it here.", version
        )  # fmt: skip
        return False
    return True


def models_initialized_later(root: nn.Module) -> list[nn.Module]:
    """The outermost ``transformers`` models in ``root`` whose initialisation ``deferred_pretrained_loading(...,
    initialize_later=True)`` skipped at construction, for the strategy to run once they are sharded. Each is
    handed out once."""
    found = [model for model in hugging_face_models(root) if model in _initialization_deferred]
    for model in found:
        for module in model.modules():
            _initialization_deferred.discard(module)
    return found


def _build_deferred(cls: Any, source: str, args: tuple[Any, ...], kwargs: dict[str, Any], strategy: str) -> Any:
    # The Auto classes always pass adapter_kwargs (the hub revision); it names an adapter folder only when given one.
    if "_adapter_model_path" not in (kwargs.get("adapter_kwargs") or {}):
        kwargs.pop("adapter_kwargs", None)
    refused = [name for name in REFUSED_ARGUMENTS if kwargs.get(name) not in (None, False)]
    if refused or args:
        reason = REFUSED_ARGUMENTS[refused[0]] if refused else "pass them as keyword arguments"
        what = f"{source!r}, {refused[0]}=..." if refused else f"{source!r}, positional model arguments..."
        if refused[:1] == ["adapter_kwargs"]:  # the Auto classes found an adapter in the folder the user named
            what = repr(os.fspath(kwargs["adapter_kwargs"]["_adapter_model_path"]))
            reason = f"{reason} (its base model: {source!r})"
        raise TypeError(f"{cls.__name__}.from_pretrained({what}) inside configure_model under "
                        f"{strategy}: {reason}.")  # fmt: skip
    hub = {name: kwargs.pop(name) for name in HUB_ARGUMENTS if name in kwargs}
    _refuse_missing_folder(source)
    ignore_mismatched = bool(kwargs.pop("ignore_mismatched_sizes", False))
    for ignored in ("use_safetensors", "weights_only", "disable_mmap", "low_cpu_mem_usage", "_from_auto",
                    "_from_pipeline", "trust_remote_code"):  # fmt: skip
        kwargs.pop(ignored, None)
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", "auto"))
    config = kwargs.pop("config", None)
    if config is None or isinstance(config, (str, os.PathLike)):
        config, kwargs = cls.config_class.from_pretrained(
            config or source, return_unused_kwargs=True, **hub, **kwargs
        )  # fmt: skip
    files = _checkpoint_files(source, hub)
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or _first_floating_dtype(files)
    model = cls._from_config(config, dtype=dtype, **kwargs)
    model.name_or_path = source
    _load_generation_config(model, source, hub)
    _pending[model] = [match_names(model, files, source, ignore_mismatched)]
    model.eval()  # as from_pretrained returns it
    return model


def _refuse_missing_folder(source: str, adapter: bool = False) -> None:
    """A path that names no folder, told as such (a hub id is ``name`` or ``owner/name``; transformers would try it
    as one and answer about repository names)."""
    looks_local = os.path.isabs(source) or source.startswith((".", "~")) or source.count("/") > 1
    if looks_local and not Path(source).expanduser().exists():
        call = f"PeftModel.from_pretrained(..., {source!r})" if adapter else f"from_pretrained({source!r})"
        holds = (
            "adapter_config.json and adapter_model.safetensors" if adapter else "config.json and the safetensors files"
        )
        raise CheckpointError(
            f"{call}: there is no such folder. Pass the folder save_pretrained wrote (it holds {holds}), or a model "
            "id of the hub."
        )


def _first_floating_dtype(files: dict[str, Path]) -> Any:
    from safetensors import safe_open

    for key, path in files.items():
        with safe_open(str(path), framework="pt") as handle:
            dtype = handle.get_slice(key).get_dtype()
        if dtype in ("F32", "F16", "BF16", "F64"):
            return _torch_dtype(dtype)
    return None


def _torch_dtype(name: str) -> Any:
    """The torch dtype of a safetensors dtype name."""
    import torch

    return getattr(torch, SAFETENSORS_DTYPES[name])


def _load_generation_config(model: Any, source: str, hub: dict[str, Any]) -> None:
    if not getattr(model, "can_generate", lambda: False)():
        return
    from transformers import GenerationConfig

    with contextlib.suppress(OSError, ValueError):
        model.generation_config = GenerationConfig.from_pretrained(source, **hub)
