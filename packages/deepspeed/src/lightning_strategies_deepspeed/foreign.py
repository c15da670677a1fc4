"""Another strategy's checkpoint under the deepspeed strategies, by ``ckpt_path`` alone (issue 29, item 2).

What the deepspeed strategies take: one full Lightning checkpoint file (``ddp``'s, and FSDP2's and ColossalAI's with
``state_dict_type="full"``), or a folder that its package writes as one such file without losing anything (FSDP2's
DCP folders, ColossalAI's sharded folders), read in that one-file form: converted once by global rank 0 and kept
inside the folder (core's ``one_file_for``).

- Fitting with an optimizer: global rank 0 writes the file in DeepSpeed's universal layout (``from_full``: each
  parameter's fp32 value and Adam moments by name), and every rank loads it with DeepSpeed's universal loader on
  its own partitions. A folder keeps it inside, beside its one-file form (``converted-deepspeed``), for later
  resumes, which read it without the one-file form (deleted, that is not written again for them); a file's goes
  into a scratch folder beside it, removed once every rank has read it, and is written again on every such resume
  (about four times the fp32 weights of disk, for as long as the load takes): convert once by hand
  (``lightning-strategies convert CKPT OUT --to deepspeed``) to keep it.
- Fitting from a file without optimizer states: refused (as ``ddp`` refuses it), naming ``load_full_weights=True``
  to agree to a fresh optimizer.
- Otherwise (validate, test, predict; a fit without an optimizer): its weights load as with
  ``load_full_weights=True``.

Fabric's ``load`` takes the same, saved by ``fabric.save`` under another strategy: the file holds the user's keys
(``{"model": ..., "optimizer": ...}``), read in the Trainer's layout (core's ``as_trainer_layout``) for the conversion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_info

from lightning_strategies import CheckpointError
from lightning_strategies.checkpoints import (
    FILE,
    as_trainer_layout,
    cannot_write,
    convert_once,
    form_for_the_load,
    identify,
    is_local,
    kept_form,
    load_file,
    one_file_here,
    saved_entry,
    source_record,
)
from lightning_strategies_deepspeed.checkpoint_layout import DEEPSPEED
from lightning_strategies_deepspeed.from_full import from_full_checkpoint, universal_from_full
from lightning_strategies_deepspeed.universal import SOURCE


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
    weights_only: bool | None,
    check: Callable[[Path], None],
    fabric_keys: tuple[str, str] | None = None,
) -> Iterator[Path]:
    """The universal form of another strategy's ``checkpoint`` (a full checkpoint file, or a folder converted from its
    one-file form), made by global rank 0, in which every rank loads it within the block. Called on every rank
    together. ``check`` refuses the full file before it is converted (one without the optimizer states to carry);
    ``fabric_keys``: the model's and the optimizer's keys of a file ``fabric.save`` wrote.

    A folder keeps it inside (``kept_form``), reused while the folder's files (and the keys) are those it was
    converted from: the folder's one-file form is then not read, and may have been deleted. A file's, or a folder's
    that cannot be written, goes into a scratch folder beside it, removed once every rank has read it; where the block
    fails, once every rank has left it (else it is left, named after this process, for a later conversion there to
    remove when the process is gone)."""
    checkpoint = Path(checkpoint)
    by_hand = f"`lightning-strategies convert {checkpoint} OUT --to deepspeed`"

    def failure(error: Exception) -> str:
        if isinstance(error, CheckpointError):
            return str(error)
        return (
            f"{checkpoint} is read under {type(strategy).__name__} in DeepSpeed's universal layout, written first "
            f"inside or beside it, and that failed: {type(error).__name__}: {error} Convert it where it can be "
            f"written ({by_hand}) and resume from OUT."
        )

    def checked() -> Path:
        """The full file to convert, refused by ``check`` before anything is written for it."""
        full = one_file_here(checkpoint, type(strategy).__name__, weights_only)
        check(full)
        return full

    def convert(full: Path, target: Path) -> None:
        if fabric_keys is None:
            from_full_checkpoint(full, target, weights_only)
        else:
            saved = load_file(full, weights_only, map_location="cpu", mmap=True)
            universal_from_full(as_trainer_layout(saved, *fabric_keys), full, target)

    def make(scratch: Callable[[Path], Path]) -> tuple[Path, str]:
        if checkpoint.is_dir():
            try:
                return _kept_in(checkpoint, fabric_keys, lambda target: convert(checked(), target))
            except OSError as error:
                if not cannot_write(error):
                    raise
                rank_zero_info(f"{checkpoint} cannot be written here ({error}): its universal form goes beside it.")
        full = checked()
        target = scratch(checkpoint.parent) / "universal"
        convert(full, target)
        return target, f"written for this resume at {target} and removed after"

    what = f"the universal form of {checkpoint}"
    with form_for_the_load(strategy, make, failure, "latest_universal", what, by_hand) as (target, how):
        rank_zero_info(
            f"Resuming {checkpoint} under {type(strategy).__name__} from its universal form, {how} (weights, Adam "
            "moments and steps, and the rest of what was saved, carried)."
        )
        yield target


def _kept_in(folder: Path, fabric_keys: tuple[str, str] | None, convert: Callable[[Path], None]) -> tuple[Path, str]:
    """The universal form kept inside another strategy's ``folder``: written unless the one there was converted from
    the folder's files as they are now, with the same ``fabric_keys``. Its place, and how it came to be there."""
    target = kept_form(folder, DEEPSPEED.key)
    source = source_record(folder, fabric_keys=list(fabric_keys) if fabric_keys else None)
    if convert_once(target / "latest_universal", target / SOURCE, source, lambda: convert(target), output=target):
        return target, f"kept at {target} by an earlier resume"
    return target, f"written at {target} and kept for later resumes (delete it to reclaim the space)"
