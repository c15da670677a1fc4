"""Every colossalai name trains, saves and resumes on the machine's several GPUs, in one launch (run by
tests/test_gpu.py; Lightning launches the other ranks).

Usage: python several_gpus.py OUT_FOLDER DEVICES RUNS
RUNS is a JSON object {strategy name: {"state_dict_type": ..., "precision": ...}}; the names run one after
another in the same processes, each in OUT_FOLDER/NAME, so the launch pays once for imports and rendezvous.
Rank 0 writes OUT_FOLDER/results.json after each name: its losses, the ranks gathered across the GPUs, whether
a save failing half way on every rank left the previous checkpoint as it was, and whether fp32 master weights
resumed from it equal uninterrupted ones. A name that raises records its error, and the others still run.
Runs stop on whole epochs (3 batches each): Lightning restarts a non-resumable dataloader from the epoch's
start, so a run stopped mid-epoch would replay batches after the resume.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).parent))
from failing_save import DISK_FULL, digests, disk_full_half_way
from tiny_gpt import TinyGPT

from lightning_strategies import get_registry
from lightning_strategies_colossalai.checkpoint_state import fp32_chunk_transfers

# TinyGPT is far below the default min_chunk_size: with it Gemini would keep the model gathered on the
# GPUs. Smaller chunks make the "cpu" placement really shard and offload them.
SMALL_CHUNKS = 2**16


def trainer(out: Path, name: str, devices: int, state_dict_type: str, precision: str, epochs: int) -> L.Trainer:
    """A Trainer for the strategy name with its registered defaults, the checkpoint format asked for, and (for
    colossalai_cpu) chunks small enough to offload."""
    chunks = {"min_chunk_size": SMALL_CHUNKS} if name == "colossalai_cpu" else {}
    return L.Trainer(
        accelerator="cuda",
        devices=devices,
        precision=precision,
        max_epochs=epochs,
        limit_train_batches=3,
        logger=False,
        strategy=get_registry().resolve(name, state_dict_type=state_dict_type, **chunks),
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=out,
        limit_val_batches=0,
    )


def full_weights(trainer: L.Trainer) -> dict:
    """Every rank gets the gathered fp32 master weights (only_rank_0=False), whatever the checkpoint format."""
    model = trainer.strategy._gemini_model
    with fp32_chunk_transfers(model):
        return {key: value.clone() for key, value in model.state_dict(only_rank_0=False).items()}


def train_save_and_resume(out: Path, name: str, devices: int, state_dict_type: str, precision: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    L.seed_everything(7)
    straight = trainer(out, name, devices, state_dict_type, precision, epochs=2)
    straight_model = TinyGPT()
    straight.fit(straight_model)
    reference = full_weights(straight)

    L.seed_everything(7)
    first = trainer(out, name, devices, state_dict_type, precision, epochs=1)
    first.fit(TinyGPT())
    checkpoint = out / f"half-{state_dict_type}.ckpt"
    first.save_checkpoint(checkpoint)
    previous = digests(checkpoint)
    try:
        with disk_full_half_way(first.strategy):
            first.save_checkpoint(checkpoint)
        failed = False
    except OSError as error:
        failed = DISK_FULL in str(error)
    kept = digests(checkpoint) == previous and [item.name for item in out.glob("*.ckpt")] == [checkpoint.name]
    saved = full_weights(first)  # gathered by every rank; the GPU test loads the checkpoint on one GPU against it
    if first.is_global_zero:
        torch.save({key: value.cpu() for key, value in saved.items()}, out / "saved_weights.pt")

    L.seed_everything(7)
    second = trainer(out, name, devices, state_dict_type, precision, epochs=2)
    resumed_model = TinyGPT()
    second.fit(resumed_model, ckpt_path=checkpoint)
    resumed = full_weights(second)

    gathered = straight.strategy.all_gather(torch.tensor([float(straight.global_rank)], device="cuda"))
    equal = all(torch.equal(reference[key].float(), resumed[key].float()) for key in reference)
    max_difference = max(float((reference[key].float() - resumed[key].float()).abs().max()) for key in reference)
    return {
        "placement_policy": straight.strategy.settings.placement_policy,
        "world_size": straight.world_size,
        "losses": straight_model.losses,
        "finite": bool(torch.isfinite(torch.tensor(straight_model.losses)).all()),
        "resumed_equal": equal,
        "max_difference": max_difference,
        "keys": len(reference),
        "gathered_ranks": gathered.flatten().tolist(),
        "global_step": second.global_step,
        "checkpoint": str(checkpoint),
        "checkpoint_is_folder": checkpoint.is_dir(),
        "failed_save_kept_previous": failed and kept,
    }


def main() -> None:
    out, devices, runs = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    results: dict[str, dict] = {}
    for name, options in runs.items():
        try:
            result = train_save_and_resume(out / name, name, devices, options["state_dict_type"], options["precision"])
        except Exception as error:  # one failing name must not hide the others' results
            result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            continue
        results[name] = result
        (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
