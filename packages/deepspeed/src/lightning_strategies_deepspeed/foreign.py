"""Another strategy's checkpoint under the deepspeed strategies, by ``ckpt_path`` alone (issue 29, item 2).

What the deepspeed strategies take: one full Lightning checkpoint file (``ddp``'s, and FSDP2's and ColossalAI's with
``state_dict_type="full"``), or a folder that its package writes as one such file without losing anything (FSDP2's
DCP folders, ColossalAI's sharded folders), read in that one-file form: converted once by global rank 0 and kept
inside the folder (core's ``one_file_for``).

- Fitting with an optimizer: global rank 0 writes the file in DeepSpeed's universal layout (``from_full``: each
  parameter's fp32 value and Adam moments by name) into a scratch folder beside the checkpoint, every rank loads it
  with DeepSpeed's universal loader on its own partitions, and rank 0 removes it once all have. It is written again
  on every such resume (about four times the fp32 weights of disk, for as long as the load takes); convert once by
  hand (``lightning-strategies convert CKPT OUT --to deepspeed``) to keep it.
- Fitting from a file without optimizer states: refused (as ``ddp`` refuses it), naming ``load_full_weights=True``
  to agree to a fresh optimizer.
- Otherwise (validate, test, predict; a fit without an optimizer): its weights load as with
  ``load_full_weights=True``.

Fabric's ``load`` takes the same, saved by ``fabric.save`` under another strategy: the file holds the user's keys
(``{"model": ..., "optimizer": ...}``), read in the Trainer's layout (core's ``as_trainer_layout``) for the conversion.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_info

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import (
    FILE,
    as_trainer_layout,
    check_seen,
    identify,
    is_local,
    load_file,
    on_rank_zero,
    saved_entry,
    scratch_folder,
)
from lightning_strategies_deepspeed.checkpoint_layout import DEEPSPEED
from lightning_strategies_deepspeed.from_full import from_full_checkpoint, universal_from_full


def is_foreign(path: Any) -> bool:
    """A checkpoint of another strategy that the deepspeed strategies read in its one-file form."""
    if not is_local(path):
        return False
    found = identify(path)
    return found is not None and found != DEEPSPEED and (found == FILE or bool(found.to_full_checkpoint))


def holds_optimizer_states(
    path: str | Path, weights_only: bool | None, fabric_keys: tuple[str, str] | None = None
) -> bool:
    """Whether the file holds optimizer states: the Trainer's, or under ``fabric_keys``' optimizer key beside its
    model's (a file without the model's is refused by name, before its optimizer is asked after)."""
    # Mapped, not read: only the pickled structure is looked at.
    checkpoint = load_file(path, weights_only, map_location="cpu", mmap=True)
    if fabric_keys is None:
        return isinstance(checkpoint, dict) and bool(checkpoint.get("optimizer_states"))
    model_key, optimizer_key = fabric_keys
    saved_entry(checkpoint, model_key)
    return bool(checkpoint.get(optimizer_key))


@contextmanager
def universal_form(
    strategy: Any,
    checkpoint: Any,
    full: str | Path,
    weights_only: bool | None,
    fabric_keys: tuple[str, str] | None = None,
) -> Iterator[Path]:
    """The universal form of the full checkpoint file ``full`` (``checkpoint`` itself, or its one-file form inside
    it), written by global rank 0 beside ``checkpoint`` for the block, in which every rank loads it. Called on every
    rank together. ``fabric_keys``: the model's and the optimizer's keys of a file ``fabric.save`` wrote."""
    full = Path(full)
    by_hand = f"`lightning-strategies convert {full} OUT --to deepspeed`"

    def failure(error: Exception) -> str:
        if isinstance(error, CheckpointError):
            return str(error)
        return (
            f"{full} is read under {type(strategy).__name__} in DeepSpeed's universal layout, written beside it "
            f"first, and that failed: {type(error).__name__}: {error} Convert it where it can be written ({by_hand}) "
            "and resume from OUT."
        )

    with ExitStack() as stack:

        def write() -> str:
            target = stack.enter_context(scratch_folder(Path(checkpoint).parent)) / "universal"
            if fabric_keys is None:
                from_full_checkpoint(full, target, weights_only)
            else:
                saved = load_file(full, weights_only, map_location="cpu", mmap=True)
                universal_from_full(as_trainer_layout(saved, *fabric_keys), full, target)
            return str(target)

        target = on_rank_zero(strategy, write, failure)
        check_seen(strategy, Path(target) / "latest_universal", f"the universal form of {full}", by_hand)
        rank_zero_info(
            f"Resuming {full} under {type(strategy).__name__} from its universal form, written for this resume at "
            f"{target} and removed after (weights, Adam moments and steps, and the rest of what was saved, carried)."
        )
        yield Path(target)
        strategy.barrier()  # every rank has read it before rank 0 removes it
