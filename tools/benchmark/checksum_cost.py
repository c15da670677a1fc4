"""What the DCP shard checksums of the fsdp strategies cost on save and load.

``python -m tools.benchmark.checksum_cost``: the GPT of model.py, sharded with FSDP2 in one process (one GPU, or the
CPU), after one Adam step (so the optimizer holds its moments). Its model and optimizer state are saved as the
strategy saves a sharded checkpoint (``save_sharded``: a CRC-32 of each piece summed as it is written) and as DCP
saves it by default (``FileSystemWriter``, no sums), in turns, ``--repeats`` times each; then loaded with the sums
checked (``mismatches`` before ``dcp.load``) and without. Every save is written to a new folder, synced as DCP syncs
it, and removed after. Times and their median and spread go to ``--out`` as JSON, with the device, versions, date
and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard

from lightning_strategies_fsdp.checkpoint import save_sharded
from lightning_strategies_fsdp.checksums import mismatches, saved_checksums
from tools.benchmark.environment import versions
from tools.benchmark.model import GPT
from tools.benchmark.sizes import SIZES, VOCABULARY


def sharded_state(size: str, device: torch.device) -> dict[str, Any]:
    """The model's and Adam's state after one step, as the fsdp strategies save it (DTensor shards)."""
    torch.manual_seed(0)
    model = GPT(SIZES[size], length=128).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randint(0, VOCABULARY, (1, 129), device=device)).backward()
    optimizer.step()
    return {"model": get_model_state_dict(model), "optimizer_0": get_optimizer_state_dict(model, optimizer)}


def timed(action: Any, target: Path) -> float:
    began = time.perf_counter()
    action(target)
    return time.perf_counter() - began


def measure(state: dict[str, Any], folder: Path, repeats: int) -> dict[str, list[float]]:
    def save_plain(target: Path) -> None:
        dcp.save(state, storage_writer=FileSystemWriter(target))

    def save_with_checksums(target: Path) -> None:
        save_sharded(target, state, {}, rank=0)

    def load_checked(target: Path) -> None:
        sums = saved_checksums(target)
        mismatches(target, set(sums), sums)
        dcp.load(state, checkpoint_id=target)

    def load_plain(target: Path) -> None:
        dcp.load(state, checkpoint_id=target)

    saves = {"save_with_checksums": save_with_checksums, "save_plain": save_plain}
    times: dict[str, list[float]] = {"save_with_checksums": [], "save_plain": [], "load_checked": [], "load_plain": []}
    for repeat in range(repeats):
        # In turns: the first save of a call is the slowest, and it falls on each kind in turn.
        for kind in list(saves) if repeat % 2 == 0 else list(reversed(saves)):
            times[kind].append(timed(saves[kind], folder / f"{kind}-{repeat}"))
        times["load_checked"].append(timed(load_checked, folder / f"save_with_checksums-{repeat}"))
        times["load_plain"].append(timed(load_plain, folder / f"save_plain-{repeat}"))
        for path in folder.iterdir():
            shutil.rmtree(path)
    return times


def summary(times: dict[str, list[float]]) -> dict[str, Any]:
    stats = {kind: {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values),
                    "runs_s": values} for kind, values in times.items()}  # fmt: skip
    for operation, plain in (("save", "save_plain"), ("load", "load_plain")):
        with_sums = "save_with_checksums" if operation == "save" else "load_checked"
        stats[f"{operation}_overhead"] = stats[with_sums]["median_s"] / stats[plain]["median_s"] - 1
    return stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark.checksum_cost", description=__doc__)
    parser.add_argument("--size", default="1.3b", choices=sorted(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=None, help="where the checkpoints go (default: a temporary one)")
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    try:
        state = sharded_state(arguments.size, device)
        size_bytes = sum(t.numel() * t.element_size() for t in _tensors(state))
        with tempfile.TemporaryDirectory(dir=arguments.folder) as folder:
            times = measure(state, Path(folder), arguments.repeats)
    finally:
        dist.destroy_process_group()
    record = {
        "size": arguments.size, "state_bytes": size_bytes, "repeats": arguments.repeats,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "date": time.strftime("%Y-%m-%d"),
        "commit": os.environ.get("COMMIT", ""), "versions": versions(), **summary(times),
    }  # fmt: skip
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(record, indent=1))
    print(json.dumps({key: value for key, value in record.items() if key != "versions"}, indent=1))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        return [local] if local.dim() else []
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in _tensors(item)]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


if __name__ == "__main__":
    main()
