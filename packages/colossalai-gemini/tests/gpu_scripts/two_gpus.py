"""Two-GPU training and checkpoint round trip (run by tests/test_gpu.py; Lightning launches rank 1).

Usage: python two_gpus.py OUT_FOLDER STATE_DICT_TYPE PLACEMENT PRECISION
Writes OUT_FOLDER/result.json on rank 0: losses, whether a save failing half way on both ranks left the
previous checkpoint as it was, and whether fp32 master weights resumed from it equal uninterrupted ones.
Runs stop on whole epochs (3 batches each): Lightning restarts a non-resumable dataloader from the epoch's
start, so a run stopped mid-epoch would replay batches after the resume.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).parent))
from failing_save import DISK_FULL, digests, disk_full_half_way
from tiny_gpt import TinyGPT

from lightning_strategies_colossalai.checkpoint_state import fp32_chunk_transfers
from lightning_strategies_colossalai.strategy import ColossalAIStrategy

# TinyGPT is far below the default min_chunk_size: with it Gemini would keep the model gathered on the
# GPUs. Smaller chunks make the "cpu" placement really shard and offload them.
SMALL_CHUNKS = 2**16


def trainer(out: Path, state_dict_type: str, placement: str, precision: str, epochs: int) -> L.Trainer:
    chunks = {"min_chunk_size": SMALL_CHUNKS} if placement == "cpu" else {}
    return L.Trainer(
        accelerator="cuda",
        devices=2,
        precision=precision,
        max_epochs=epochs,
        limit_train_batches=3,
        logger=False,
        strategy=ColossalAIStrategy(placement_policy=placement, state_dict_type=state_dict_type, **chunks),
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


def main() -> None:
    out, state_dict_type, placement, precision = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    L.seed_everything(7)
    straight = trainer(out, state_dict_type, placement, precision, epochs=2)
    straight_model = TinyGPT()
    straight.fit(straight_model)
    reference = full_weights(straight)

    L.seed_everything(7)
    first = trainer(out, state_dict_type, placement, precision, epochs=1)
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
    second = trainer(out, state_dict_type, placement, precision, epochs=2)
    resumed_model = TinyGPT()
    second.fit(resumed_model, ckpt_path=checkpoint)
    resumed = full_weights(second)

    gathered = straight.strategy.all_gather(torch.tensor([float(straight.global_rank)], device="cuda"))
    equal = all(torch.equal(reference[key].float(), resumed[key].float()) for key in reference)
    max_difference = max(float((reference[key].float() - resumed[key].float()).abs().max()) for key in reference)
    if straight.is_global_zero:
        (out / "result.json").write_text(
            json.dumps(
                {
                    "losses": straight_model.losses,
                    "finite": bool(torch.isfinite(torch.tensor(straight_model.losses)).all()),
                    "resumed_equal": equal,
                    "max_difference": max_difference,
                    "keys": len(reference),
                    "gathered_ranks": gathered.flatten().tolist(),
                    "global_step": second.global_step,
                    "checkpoint_is_folder": checkpoint.is_dir(),
                    "failed_save_kept_previous": failed and kept,
                }
            )
        )


if __name__ == "__main__":
    main()
