"""DeepSpeed checkpoint directories: finding them, converting them, loading full weights into ZeRO-3.

A checkpoint the strategies save is a directory ``<path>/`` holding a ``latest`` file and one
tag folder (``checkpoint/``) with one shard per rank; Lightning's own state (epoch, loops,
callbacks, schedulers) travels inside ``mp_rank_00_model_states.pt``. Users point at the
directory, the tag folder, or a file inside; all three are accepted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TAG = "checkpoint"
UNIVERSAL_SUFFIX = "_universal"
_MODEL_STATES = "mp_rank_00_model_states.pt"  # ZeRO-3 writes zero_pp_rank_<r>_mp_rank_00_model_states.pt
_RANK_0_MODEL_STATES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
# What DeepSpeed keeps next to the client state in the model-states file; not Lightning's.
_DEEPSPEED_KEYS = frozenset(
    {
        "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
        "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
        "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
        "ds_version", "universal_checkpoint_info",
    }
)  # fmt: skip


def _is_tag_folder(path: Path) -> bool:
    return any(path.joinpath(name).is_file() for name in _RANK_0_MODEL_STATES)


def _rank_0_model_states(tag_folder: Path) -> Path:
    for name in _RANK_0_MODEL_STATES:
        if tag_folder.joinpath(name).is_file():
            return tag_folder / name
    raise FileNotFoundError(f"{str(tag_folder)!r} holds no model-states file of rank 0; the checkpoint is incomplete.")


@dataclass(frozen=True)
class CheckpointLocation:
    directory: Path
    tag: str | None
    universal: bool


def universal_info() -> dict[str, Any]:
    """The marker DeepSpeed's universal conversion requires in a checkpoint's client state."""
    return {"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}


def locate(path: str | os.PathLike) -> CheckpointLocation:
    """The checkpoint directory and tag behind ``path``, or an error saying what was expected."""
    path = Path(path)
    if path.is_file() and _is_tag_folder(path.parent):
        path = path.parent  # a file inside a tag folder
    if _is_tag_folder(path):
        return CheckpointLocation(path.parent, path.name, path.joinpath("zero").is_dir())
    if path.joinpath("latest_universal").is_file():
        return CheckpointLocation(path, None, True)
    if path.joinpath("latest").is_file():
        return CheckpointLocation(path, None, False)
    tags = sorted(child.name for child in path.iterdir() if _is_tag_folder(child)) if path.is_dir() else []
    if len(tags) == 1:
        return CheckpointLocation(path, tags[0], path.joinpath(tags[0], "zero").is_dir())
    if path.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} is a single file, not a DeepSpeed checkpoint directory. To start from full weights, use "
            "DeepSpeedStrategy(load_full_weights=True)."
        )
    raise FileNotFoundError(
        f"{str(path)!r} is not a DeepSpeed checkpoint directory (expected a 'latest' file or a tag folder holding "
        f"{_MODEL_STATES}). Pass the directory the strategy saved."
    )


def convert_zero_checkpoint(
    checkpoint: str | os.PathLike, output_file: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Merge a (sharded) DeepSpeed checkpoint into one Lightning checkpoint with a plain fp32 state dict.

    The result loads with ``torch.load`` + ``load_state_dict`` or ``LightningModule.load_from_checkpoint``,
    without DeepSpeed. Written to ``output_file`` when given, and returned.
    """
    import torch

    location = locate(checkpoint)
    tag = location.tag or location.directory.joinpath("latest").read_text().strip()
    tag_folder = location.directory / tag
    client_state = torch.load(_rank_0_model_states(tag_folder), map_location="cpu", weights_only=False)
    if any(tag_folder.glob("*optim_states.pt")) and client_state.get("ds_config", {}).get("zero_optimization", {}).get(
        "stage", 0
    ):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state_dict = get_fp32_state_dict_from_zero_checkpoint(str(location.directory), tag=tag)
    else:  # without ZeRO the model-states file holds the whole module
        state_dict = {
            name: tensor.float() if tensor.is_floating_point() else tensor
            for name, tensor in client_state["module"].items()
        }
    converted = {key: value for key, value in client_state.items() if key not in _DEEPSPEED_KEYS}
    converted["state_dict"] = dict(state_dict)
    if output_file is not None:
        Path(output_file).parent.mkdir(parents=True, exist_ok=True)
        torch.save(converted, output_file)
    return converted


def convert_to_universal(checkpoint: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """Write DeepSpeed's universal form of ``checkpoint`` into ``output_dir``, loadable on any number of devices.

    Resume from ``output_dir`` as from any checkpoint of the strategy; it is recognised as universal.
    """
    location = locate(checkpoint)
    tag = location.tag or location.directory.joinpath("latest").read_text().strip()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    universal_tag = tag + UNIVERSAL_SUFFIX
    command = [
        sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
        "--input_folder", str(location.directory / tag),
        "--output_folder", str(output_dir / universal_tag),
        "--num_extract_workers", "1", "--num_merge_workers", "1",
    ]  # fmt: skip
    environment = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"DeepSpeed's universal conversion of {str(checkpoint)!r} failed:\n{result.stderr[-4000:]}")
    output_dir.joinpath("latest_universal").write_text(universal_tag)
    return output_dir


def load_into_partitioned_module(module: Any, state_dict: dict[str, Any], strict: bool, is_global_zero: bool) -> None:
    """Load a full state dict into a ZeRO-3 module: gather each module's parameters, copy on rank 0, re-partition."""
    import deepspeed
    import torch

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
