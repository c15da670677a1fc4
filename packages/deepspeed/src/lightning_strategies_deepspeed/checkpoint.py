"""DeepSpeed checkpoint directories: writing, finding, reading and converting them, loading full weights into ZeRO-3.

A checkpoint the strategies save is a directory ``<path>/`` holding a ``latest`` file and one
tag folder (``checkpoint/``) with one shard per rank; Lightning's own state (epoch, loops,
callbacks, schedulers) travels inside ``mp_rank_00_model_states.pt``. Users point at the
directory, the tag folder, or a file inside; all three are accepted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from lightning_strategies import CheckpointError, CheckpointNotFoundError
from lightning_strategies.checkpoints import check_file, foreign_checkpoint_error, load_file, staged_save
from lightning_strategies_deepspeed import compatibility

TAG = "checkpoint"
UNIVERSAL_SUFFIX = "_universal"
_MODEL_STATES = "mp_rank_00_model_states.pt"  # ZeRO-3 writes zero_pp_rank_<r>_mp_rank_00_model_states.pt
_READS = (
    f"a DeepSpeed checkpoint directory (a 'latest' file and a tag folder holding {_MODEL_STATES}), or one file "
    "of full weights with DeepSpeedStrategy(load_full_weights=True)"
)
_RANK_0_MODEL_STATES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
# What DeepSpeed keeps next to the client state in the model-states file; not Lightning's.
_DEEPSPEED_KEYS = frozenset(
    {
        "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
        "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
        "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
        "ds_version", "universal_checkpoint_info", "checkpoint_parallel_dimensions",
    }
)  # fmt: skip
# Where the user's entries named like one of those travel: DeepSpeed would overwrite its own value with
# the user's on save (a wrong mp_world_size breaks the next load) or drop the user's on load.
_SHADOWED_KEYS = "lightning_strategies_shadowed_keys"


# Lightning's words for a path that holds no DeepSpeed checkpoint (a FileNotFoundError), and for one DeepSpeed finds
# nothing to load in, which ours begin with.
_NOT_A_CHECKPOINT = "The provided path is not a valid DeepSpeed checkpoint: {path}. "
_UNABLE_TO_LOAD = "DeepSpeed was unable to load the checkpoint. "


class CheckpointNotLoadedError(CheckpointError, MisconfigurationException, RuntimeError):
    """A DeepSpeed checkpoint with nothing for DeepSpeed to load in it. Where DeepSpeed finds nothing, Lightning's
    Trainer strategy raises a MisconfigurationException and its Fabric strategy a RuntimeError; ours knows before
    loading."""


def _is_tag_folder(path: Path) -> bool:
    return any(path.joinpath(name).is_file() for name in _RANK_0_MODEL_STATES)


def _is_deepspeed_directory(path: Path) -> bool:
    try:
        locate(path)
    except CheckpointError:
        return False
    return True


def rank_0_model_states(tag_folder: Path) -> Path:
    for name in _RANK_0_MODEL_STATES:
        if tag_folder.joinpath(name).is_file():
            return tag_folder / name
    raise CheckpointNotLoadedError(
        f"{_UNABLE_TO_LOAD}{tag_folder} holds no model-states file of rank 0 ({_MODEL_STATES}): the checkpoint is "
        "incomplete. Copy it again from where it was written, or use an earlier checkpoint."
    )


@dataclass(frozen=True)
class CheckpointLocation:
    directory: Path
    tag: str
    universal: bool

    @property
    def tag_folder(self) -> Path:
        return self.directory / self.tag


def _client_state(state: dict[str, Any]) -> dict[str, Any]:
    """The user's (or Lightning's) state as DeepSpeed's client state, safe from DeepSpeed's own keys."""
    client_state = {key: value for key, value in state.items() if key not in _DEEPSPEED_KEYS}
    shadowed = {key: value for key, value in state.items() if key in _DEEPSPEED_KEYS}
    if shadowed:
        client_state[_SHADOWED_KEYS] = shadowed
    # The marker DeepSpeed's universal conversion requires in a checkpoint's client state.
    client_state["universal_checkpoint_info"] = {"universal_checkpoint_version": 0.2}
    return client_state


def _restore_shadowed_keys(client_state: dict[str, Any]) -> dict[str, Any]:
    client_state.update(client_state.pop(_SHADOWED_KEYS, None) or {})
    return client_state


def locate(path: str | os.PathLike) -> CheckpointLocation:
    """The checkpoint directory and tag behind ``path``, or a CheckpointError saying what ``path`` is instead."""
    path = Path(path)
    if path.is_file() and _is_tag_folder(path.parent):
        path = path.parent  # a file inside a tag folder
    if _is_tag_folder(path):
        return CheckpointLocation(path.parent, path.name, path.joinpath("zero").is_dir())
    for latest_name, universal in (("latest_universal", True), ("latest", False)):
        if path.joinpath(latest_name).is_file():
            tag = path.joinpath(latest_name).read_text().strip()
            if not tag or not _is_tag_folder(path / tag):
                raise CheckpointNotLoadedError(
                    f"{_UNABLE_TO_LOAD}The DeepSpeed checkpoint {path} is incomplete: its '{latest_name}' file names "
                    f"the tag {tag!r}, but there is no folder {path / tag} holding {_MODEL_STATES}. Copy it again "
                    "from where it was written, or resume from an earlier checkpoint."
                )
            return CheckpointLocation(path, tag, universal)
    tags = sorted(child.name for child in path.iterdir() if _is_tag_folder(child)) if path.is_dir() else []
    if len(tags) == 1:
        return CheckpointLocation(path, tags[0], path.joinpath(tags[0], "zero").is_dir())
    if len(tags) > 1:
        raise CheckpointNotFoundError(
            f"{_NOT_A_CHECKPOINT.format(path=path)}It holds several DeepSpeed checkpoints ({', '.join(tags)}) and no "
            f"'latest' file naming one. Pass the one to load, e.g. {path / tags[-1]}."
        )
    if not path.exists():
        raise CheckpointNotFoundError(
            f"{_NOT_A_CHECKPOINT.format(path=path)}No checkpoint at that path. Check the path: a DeepSpeed checkpoint "
            "is the directory given to trainer.save_checkpoint or written by ModelCheckpoint (a 'latest' file and a "
            "'checkpoint' folder)."
        )
    # Lightning's DeepSpeed strategies raise FileNotFoundError for a path that holds no DeepSpeed checkpoint.
    foreign = foreign_checkpoint_error(path, "DeepSpeedStrategy", _READS)
    raise CheckpointNotFoundError(f"{_NOT_A_CHECKPOINT.format(path=path)}{foreign}")


def inspect(
    path: str | os.PathLike, weights_only: bool | None = None
) -> tuple[CheckpointLocation, compatibility.SavedLayout]:
    """Where the checkpoint behind ``path`` is and how it was split, once its files are known to be whole."""
    location = locate(path)
    compatibility.check_saved_files(location.tag_folder)
    # Memory-mapped: only the pickled structure is read here, the tensors stay on disk.
    rank_0_state = read_saved_file(rank_0_model_states(location.tag_folder), weights_only, mmap=True)
    layout = compatibility.SavedLayout.of(location.tag_folder, rank_0_state)
    if not location.universal:
        compatibility.check_complete(location.directory, location.tag, layout)
    return location, layout


def saved_with_the_other_zero(location: CheckpointLocation, layout: compatibility.SavedLayout, zero_3: bool) -> bool:
    """Whether a ZeRO folder was saved with stage 3 where this run uses stage 1 or 2, or the reverse: ZeRO-3 partitions
    the weights too, and DeepSpeed loads neither kind into the other. The strategies read such a folder as another
    strategy's, through its one-file form and the universal layout (a universal folder loads under every stage)."""
    return not location.universal and bool(layout.parameter_ranks) != zero_3


def load_into_engine(
    engine: Any,
    location: CheckpointLocation,
    layout: compatibility.SavedLayout,
    world_size: int,
    load_optimizer_states: bool,
    weights_only: bool | None,
    strict: bool,
) -> dict[str, Any]:
    """Have the engine load the checkpoint (on every rank); return the client state saved with it."""
    loads_universal = engine._config.load_universal_checkpoint
    if location.universal:
        check_universal_fits_stage(location, engine.zero_optimization_stage(), load_optimizer_states)
        # Read by engine.load_checkpoint only; set for this load alone, so that a later load on the same engine
        # (validate after a resume converted on the fly) reads its own checkpoint's layout.
        engine._config.load_universal_checkpoint = True
    else:  # a universal checkpoint loads on any number of processes
        engine_layout = compatibility.EngineLayout.of(engine, world_size)
        compatibility.check_fits(location.directory, layout, engine_layout, load_optimizer_states)
    try:
        with checked_reads(engine, weights_only):
            _, client_state = engine.load_checkpoint(
                str(location.directory),
                tag=location.tag,
                load_optimizer_states=load_optimizer_states,
                load_lr_scheduler_states=False,  # Lightning restores its schedulers from the client state
                load_module_strict=strict,
            )
    finally:
        engine._config.load_universal_checkpoint = loads_universal
    if client_state is None:
        raise CheckpointNotLoadedError(
            f"{_UNABLE_TO_LOAD}It found nothing to load in {location.tag_folder}. Pass the directory the strategy "
            "saved, or a single weights file with load_full_weights=True."
        )
    return _restore_shadowed_keys(client_state)


def check_universal_fits_stage(location: CheckpointLocation, stage: int, load_optimizer_states: bool) -> None:
    """ZeRO stage 3 restores one step count and one set of hyperparameters for all parameters from a universal folder
    (DeepSpeed's KeyError otherwise): only folders converted from stage 3, or written from one full file whose param
    groups agree, hold them. Refused before DeepSpeed reads the folder, with the stages that do resume it."""
    if stage != 3 or not load_optimizer_states:
        return
    state = read_saved_file(location.tag_folder / "zero" / "optimizer_state.pt", weights_only=False, mmap=True)
    if STAGE_3_OPTIMIZER_STATE in state:
        return
    raise CheckpointError(
        f"{location.directory} is in DeepSpeed's universal layout without the one step count and set of "
        "hyperparameters that ZeRO stage 3 restores for all parameters: it was converted from ZeRO stage 1 or 2, or "
        "written by `lightning-strategies convert --to deepspeed` from a run whose param groups differ in them. "
        "Resume it under deepspeed_stage_1 or deepspeed_stage_2, or its weights alone under stage 3 "
        "(`lightning-strategies convert CKPT weights.ckpt --to full --drop-optimizer-states`, then "
        "DeepSpeedStrategy(stage=3, load_full_weights=True); the optimizer starts afresh)."
    )


def save(engine: Any, path: Path, client_state: dict[str, Any], exclude_frozen_parameters: bool) -> None:
    """Write the engine's checkpoint directory at ``path`` (on every rank), complete when this returns."""
    if engine.checkpoint_engine is None:
        # DeepSpeed sets no writer up for a ZeRO-3 engine built without an optimizer (validate, test, predict):
        # its save_checkpoint would fail on one rank with an AttributeError and leave the others waiting.
        raise RuntimeError(
            "DeepSpeed cannot save a checkpoint of a ZeRO stage 3 model set up for validate, test or predict (its "
            "engine has no optimizer to save with). Save during or after trainer.fit, or export the weights with "
            "`python -m lightning_strategies_deepspeed.convert` from the checkpoint that fit saved."
        )
    engine.save_checkpoint(
        str(path),
        client_state=_client_state(client_state),
        tag=TAG,
        exclude_frozen_parameters=exclude_frozen_parameters,
    )
    if getattr(engine.checkpoint_engine, "is_decoupled", lambda: False)():
        # A decoupled writer finishes in the background and is committed at the next step, but the
        # staged directory is published as soon as this returns: it must be complete by then.
        engine._commit_decoupled_checkpoint()


@contextmanager
def checked_reads(engine: Any, weights_only: bool | None) -> Iterator[None]:
    """While loading, DeepSpeed reads each file with ``weights_only`` and refuses damaged ones by name.

    Only DeepSpeed's default engine (torch.save files) is wrapped; other checkpoint engines read
    their own formats their own way.
    """
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    original = engine.checkpoint_engine
    if type(original) is not TorchCheckpointEngine:
        yield
        return
    engine.checkpoint_engine = _CheckedReads(original, weights_only)
    try:
        yield
    finally:
        engine.checkpoint_engine = original


class _CheckedReads:
    """DeepSpeed's checkpoint engine, reading through ``read_saved_file``."""

    def __init__(self, engine: Any, weights_only: bool | None) -> None:
        self._engine = engine
        self._weights_only = weights_only

    def load(self, path: str, map_location: Any = None) -> Any:
        # DeepSpeed pickles its own classes (LossScaler, ZeroStageEnum) into the optimizer-state files,
        # which weights_only=True refuses: those are read as DeepSpeed itself reads them.
        weights_only = False if path.endswith("optim_states.pt") else self._weights_only
        return read_saved_file(Path(path), weights_only, map_location=map_location)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def read_saved_file(path: Path, weights_only: bool | None, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """``torch.load`` of one file DeepSpeed wrote, with CheckpointErrors naming what is wrong with it."""
    return load_file(path, weights_only=weights_only, map_location=map_location, mmap=mmap)


def check_model_states_load(location: CheckpointLocation, weights_only: bool | None) -> None:
    """Read every rank's model-states file as a resume reads them, with the caller's ``weights_only``: DeepSpeed's
    conversions (``ds_to_universal``, ``zero_to_fp32``) unpickle them all with ``weights_only=False``, and must not
    run code that the resume itself would refuse. (The optimizer-state files hold DeepSpeed's own classes: DeepSpeed
    reads them so on every resume.)"""
    for path in sorted(location.tag_folder.glob("*model_states.pt")):
        read_saved_file(path, weights_only, mmap=True)


def check_full_weights_file(path: Path) -> None:
    """Refuse what a load of full weights cannot read: a DeepSpeed directory, a missing or damaged file."""
    if path.is_dir() and not _is_deepspeed_directory(path):
        raise foreign_checkpoint_error(path, "DeepSpeedStrategy(load_full_weights=True)", "one file of full weights")
    if path.is_dir() or (path.is_file() and _is_tag_folder(path.parent)):
        raise CheckpointError(
            f"A single file of full weights is loaded here (load_full_weights=True, or fabric.load with a module or "
            f"optimizer as the state), but {path} is (part of) a DeepSpeed checkpoint directory. Resume it as one: "
            "without load_full_weights, and with Fabric as fabric.load(path, {'model': model, 'optimizer': "
            f"optimizer}}). Or convert it into one file: `python -m lightning_strategies_deepspeed.convert {path} "
            "weights.ckpt`."
        )
    check_file(path)


def convert_zero_checkpoint(
    checkpoint: str | os.PathLike, output_file: str | os.PathLike | None = None, weights_only: bool | None = None
) -> dict[str, Any]:
    """Merge a (sharded) DeepSpeed checkpoint into one Lightning checkpoint with a plain fp32 state dict.

    The result loads with ``torch.load`` + ``load_state_dict`` or ``LightningModule.load_from_checkpoint``,
    without DeepSpeed. Written to ``output_file`` when given, and returned. ``weights_only`` applies to
    the file holding Lightning's state; DeepSpeed reads its optimizer-state files with ``weights_only=False``.
    """
    location = locate(checkpoint)
    tag_folder = location.tag_folder
    compatibility.check_saved_files(tag_folder)
    check_model_states_load(location, weights_only)
    client_state = read_saved_file(rank_0_model_states(tag_folder), weights_only)
    if any(tag_folder.glob("*optim_states.pt")) and client_state.get("ds_config", {}).get("zero_optimization", {}).get(
        "stage", 0
    ):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state_dict = get_fp32_state_dict_from_zero_checkpoint(str(location.directory), tag=location.tag)
    else:  # without ZeRO the model-states file holds the whole module
        state_dict = {
            name: tensor.float() if tensor.is_floating_point() else tensor
            for name, tensor in client_state["module"].items()
        }
    converted = lightning_state(client_state)
    converted["state_dict"] = dict(state_dict)
    if output_file is not None:
        Path(output_file).parent.mkdir(parents=True, exist_ok=True)
        with staged_save(output_file) as staged:
            torch.save(converted, staged)
    return converted


def lightning_state(client_state: dict[str, Any]) -> dict[str, Any]:
    """What Lightning saved in rank 0's model-states file (loops, callbacks, schedulers, hyperparameters), without
    what DeepSpeed keeps beside it."""
    return _restore_shadowed_keys({key: value for key, value in client_state.items() if key not in _DEEPSPEED_KEYS})


def read_weights(checkpoint: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
    """The ``read_weights`` of the DeepSpeed format: the checkpoint merged into full fp32 weights in one process, as
    ``lightning_strategies.hugging_face.export`` reads it."""
    return convert_zero_checkpoint(checkpoint, weights_only=weights_only)


def convert_to_universal(checkpoint: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """Write DeepSpeed's universal form of ``checkpoint`` into ``output_dir``, loadable on any number of devices.

    Resume from ``output_dir`` as from any checkpoint of the strategy; it is recognised as universal.
    """
    location = locate(checkpoint)
    compatibility.check_saved_files(location.tag_folder)
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()) and not output_dir.joinpath("latest_universal").is_file():
        raise CheckpointError(
            f"{output_dir} exists and is not a universal checkpoint; the conversion replaces the whole folder. "
            "Choose a new folder for it."
        )
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    universal_tag = location.tag + UNIVERSAL_SUFFIX
    with staged_save(output_dir) as staged:
        staged.mkdir()
        write_universal(location.tag_folder, staged / universal_tag, checkpoint)
        staged.joinpath("latest_universal").write_text(universal_tag)
    return output_dir


def write_universal(tag_folder: Path, output_tag_folder: Path, checkpoint: str | os.PathLike, workers: int = 1) -> None:
    """Run DeepSpeed's ds_to_universal on ``tag_folder`` into ``output_tag_folder``, in a process of its own."""
    count = str(max(1, workers))
    command = [
        sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
        "--input_folder", str(tag_folder),
        "--output_folder", str(output_tag_folder),
        "--num_extract_workers", count, "--num_merge_workers", count,
    ]  # fmt: skip
    environment = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"DeepSpeed's universal conversion of {str(checkpoint)!r} failed:\n{result.stderr[-4000:]}")


ADAM_STATES = ("exp_avg", "exp_avg_sq")
# Where ZeRO stage 3 keeps its optimizer's own state dict (deepspeed.checkpoint.constants.OPTIMIZER_STATE_DICT).
STAGE_3_OPTIMIZER_STATE = "optimizer_state_dict"


def optimizer_file_without_adam_state(location: CheckpointLocation) -> Path | None:
    """Rank 0's optimizer-state file where it keeps no Adam-type state (SGD, Adagrad, ...), else None: DeepSpeed's
    universal conversion reads ``exp_avg`` and ``exp_avg_sq`` of every parameter group and fails with a KeyError on
    any other optimizer's state."""
    optimizer_file = next(iter(sorted(location.tag_folder.glob("*zero_pp_rank_0_mp_rank_*optim_states.pt"))), None)
    if optimizer_file is None:
        return None  # DeepSpeed's own error says what is missing
    state = read_saved_file(optimizer_file, weights_only=False, mmap=True)
    return None if _holds_keys(state, ADAM_STATES) else optimizer_file


def _holds_keys(value: Any, keys: tuple[str, ...], depth: int = 0) -> bool:
    """Whether a dict nested in ``value`` (DeepSpeed nests the optimizer's own state 3 levels down) has ``keys``."""
    if depth > 6:
        return False
    if isinstance(value, dict):
        if all(key in value for key in keys):
            return True
        return any(_holds_keys(item, keys, depth + 1) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_keys(item, keys, depth + 1) for item in value)
    return False


def load_into_partitioned_module(module: Any, state_dict: dict[str, Any], strict: bool, is_global_zero: bool) -> None:
    """Load a full state dict into a ZeRO-3 module: gather each module's parameters, copy on rank 0, re-partition."""
    import deepspeed

    expected = set(module.state_dict().keys())
    missing = sorted(expected - set(state_dict))
    unexpected = sorted(set(state_dict) - expected)
    if strict and (missing or unexpected):
        raise KeyError(f"The weights do not match the model: missing {missing}, unexpected {unexpected}.")
    with torch.no_grad():
        for prefix, submodule in module.named_modules():
            own = list(submodule.named_parameters(recurse=False))
            with deepspeed.zero.GatheredParameters([parameter for _, parameter in own], modifier_rank=0):
                if is_global_zero:
                    for name, parameter in own:
                        key = f"{prefix}.{name}" if prefix else name
                        if key in state_dict:
                            parameter.copy_(state_dict[key])
            for name, buffer in submodule.named_buffers(recurse=False):  # buffers are whole on every rank
                key = f"{prefix}.{name}" if prefix else name
                if key in state_dict:
                    buffer.copy_(state_dict[key])
