"""``from_pretrained`` inside ``configure_model``: the model is built from its config in the strategy's init context
(meta device, ZeRO-3 partitions, lazy tensors) and its weights are read into each shard once the model is sharded.

``transformers`` loads weights at once, into the whole model, on every rank (and refuses the meta device). Inside
``deferred_pretrained_loading()`` it instead records where each weight is (``PretrainedWeights``); the strategy
calls ``load_pending`` once the model is sharded, and each rank reads only its part of the safetensors files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_strategies.errors import CheckpointError
from lightning_strategies.hugging_face.models import transformers_installed

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# from_pretrained arguments that say where the files are, as opposed to how to build the model.
HUB_ARGUMENTS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")
# from_pretrained arguments that place or transform weights as they load: nothing to do with a model whose weights
# the strategy places, so each is refused with what to do instead.
PLACEMENT_ARGUMENTS = {
    "device_map": "the strategy places every shard; drop device_map",
    "tp_plan": "the strategy shards the model; drop tp_plan",
    "quantization_config": "quantized models are not sharded by these strategies; load it with strategy='ddp'",
    "load_in_8bit": "quantized models are not sharded by these strategies; load it with strategy='ddp'",
    "load_in_4bit": "quantized models are not sharded by these strategies; load it with strategy='ddp'",
    "state_dict": "pass the folder the weights were saved to with save_pretrained instead of a state_dict",
    "gguf_file": "convert the GGUF file to safetensors with save_pretrained first",
}
# Where PEFT keeps the layer it wraps with an adapter (peft.tuners.tuners_utils.BaseTunerLayer.base_layer).
PEFT_WRAPPED = "base_layer"
# Weights of models built inside deferred_pretrained_loading(), until their strategy loads them. Weak, so a model
# that is dropped takes its entry with it.
_pending: weakref.WeakKeyDictionary[Any, PretrainedWeights] = weakref.WeakKeyDictionary()


# -- where the weights are -------------------------------------------------------------------------------------


@dataclass
class PretrainedWeights:
    """Where each weight of a model built by ``from_pretrained`` inside ``deferred_pretrained_loading`` is.

    ``files`` maps a checkpoint key to its safetensors file; ``names`` maps the model's own state-dict names to
    checkpoint keys (a checkpoint may be saved with or without the base model's prefix). Names absent from
    ``names`` are initialised as ``from_pretrained`` would: Hugging Face's initialisation.
    """

    source: str
    files: dict[str, Path]
    names: dict[str, str]
    missing: list[str] = field(default_factory=list)
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
    model's state-dict names are ``prefix`` + its own. Each is handed out once."""
    found = []
    for prefix, module in root.named_modules():
        weights = _pending.pop(module, None)
        if weights is not None:
            found.append((f"{prefix}." if prefix else "", module, weights))
    return found


def pretrained_tensors(root: nn.Module) -> Iterator[tuple[str, Any, PretrainedWeights, str]]:
    """``(name, tensor, weights, original)`` for each of ``root``'s parameters and buffers whose pretrained value is
    still to be read: ``name`` in ``root``'s state dict, ``weights.read(original)`` its value. Each is handed out
    once; the files are closed when the iteration ends."""
    for prefix, model, weights in pending_weights(root):
        try:
            for own_name, tensor in model.state_dict(keep_vars=True).items():
                # A PEFT adapter wraps the layers it adapts: their weights moved under "<layer>.base_layer".
                original = own_name.replace(f".{PEFT_WRAPPED}.", ".")
                if original in weights.names:
                    yield prefix + own_name, tensor, weights, original
        finally:
            weights.close()


def load_pending(root: nn.Module, write: Callable[[str, Any, PretrainedWeights, str], None]) -> int:
    """``write(name, tensor, weights, original)`` for each of ``pretrained_tensors(root)``; how many there were."""
    written = 0
    for name, tensor, weights, original in pretrained_tensors(root):
        write(name, tensor, weights, original)
        written += 1
    return written


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
    tied = set(getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or ())
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
    return PretrainedWeights(source, files, names, missing)


def _full_shape(tensor: Any) -> Any:
    return getattr(tensor, "ds_shape", tensor.shape)  # a ZeRO-3 partition keeps its whole shape beside it


# -- from_pretrained inside configure_model ----------------------------------------------------------------------


@contextlib.contextmanager
def deferred_pretrained_loading(strategy: str, initialize_later: bool = False) -> Iterator[None]:
    """Inside, ``PreTrainedModel.from_pretrained`` builds the model from its config in the surrounding init context
    and records where its weights are; the strategy named ``strategy`` reads them into its shards (``load_pending``).

    With ``initialize_later``, models built inside also skip Hugging Face's initialisation at construction (their
    layers' own still runs, and tied weights are tied), for a strategy that initialises them once they are sharded:
    under ZeRO-3 each rank holds an empty placeholder then, which ``_init_weights`` cannot index.

    The patches on ``transformers`` last exactly as long as the context: nothing outlives the hook it wraps.
    """
    if not transformers_installed():
        yield
        return
    from transformers import modeling_utils

    pretrained_model = modeling_utils.PreTrainedModel
    originals = {name: pretrained_model.__dict__[name] for name in ("from_pretrained", "init_weights")}

    def from_pretrained(cls: type, source: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
        return _build_deferred(cls, os.fspath(source), args, kwargs, strategy)

    def tie_weights_only(self: Any) -> None:
        self.tie_weights(recompute_mapping=False)

    setattr(pretrained_model, "from_pretrained", classmethod(from_pretrained))  # noqa: B010  (a method, for mypy)
    if initialize_later:
        setattr(pretrained_model, "init_weights", tie_weights_only)  # noqa: B010
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(pretrained_model, name, original)


def _build_deferred(cls: Any, source: str, args: tuple[Any, ...], kwargs: dict[str, Any], strategy: str) -> Any:
    refused = [name for name in PLACEMENT_ARGUMENTS if kwargs.get(name) not in (None, False)]
    if refused or args:
        reason = PLACEMENT_ARGUMENTS[refused[0]] if refused else "pass them as keyword arguments"
        what = f"{refused[0]}=" if refused else "positional model arguments"
        raise TypeError(f"{cls.__name__}.from_pretrained({source!r}, {what}...) inside configure_model under "
                        f"strategy={strategy!r}: {reason}.")  # fmt: skip
    hub = {name: kwargs.pop(name) for name in HUB_ARGUMENTS if name in kwargs}
    _refuse_missing_folder(source)
    ignore_mismatched = bool(kwargs.pop("ignore_mismatched_sizes", False))
    for ignored in ("use_safetensors", "weights_only", "disable_mmap", "low_cpu_mem_usage", "_from_auto",
                    "_from_pipeline", "trust_remote_code", "adapter_kwargs", "key_mapping"):  # fmt: skip
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
    _pending[model] = match_names(model, files, source, ignore_mismatched)
    model.eval()  # as from_pretrained returns it
    return model


def _refuse_missing_folder(source: str) -> None:
    """A path that names no folder, told as such (a hub id is ``name`` or ``owner/name``; transformers would try it
    as one and answer about repository names)."""
    looks_local = os.path.isabs(source) or source.startswith((".", "~")) or source.count("/") > 1
    if looks_local and not Path(source).expanduser().exists():
        raise CheckpointError(
            f"from_pretrained({source!r}): there is no such folder. Pass the folder save_pretrained wrote (it holds "
            "config.json and the safetensors files), or a model id of the hub."
        )


def _first_floating_dtype(files: dict[str, Path]) -> Any:
    import torch
    from safetensors import safe_open

    for key, path in files.items():
        with safe_open(str(path), framework="pt") as handle:
            dtype = handle.get_slice(key).get_dtype()
        if dtype in ("F32", "F16", "BF16", "F64"):
            return {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}[dtype]
    return None


def _load_generation_config(model: Any, source: str, hub: dict[str, Any]) -> None:
    if not getattr(model, "can_generate", lambda: False)():
        return
    from transformers import GenerationConfig

    with contextlib.suppress(OSError, ValueError):
        model.generation_config = GenerationConfig.from_pretrained(source, **hub)
