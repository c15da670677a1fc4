"""What a checkpoint on disk is, by its layout, so that a strategy refusing it can say what to do.

Users move between strategies mid-project: a folder saved with FSDP2 handed to DeepSpeed fails
deep inside DeepSpeed ("Unable to find latest file"), a DeepSpeed folder handed to DCP fails with
"metadata is None". Every strategy package of this project asks ``identify`` first and, for a
format it cannot read, raises ``foreign_checkpoint_error`` naming the strategy that writes it and
how to turn it into a file of full weights that any strategy loads.

Each package describes its own layout through the ``checkpoint_formats`` hook, so a layout is known
exactly where its package is installed and core holds no backend's layout. Core knows one format
itself: a single ``torch.save`` file, which is Lightning's own and which every strategy loads.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lightning_strategies.errors import CheckpointError
from lightning_strategies.hooks import plugins_of
from lightning_strategies.registry import get_registry


@dataclass(frozen=True)
class CheckpointFormat:
    """A checkpoint layout: what it is, which strategies read it, how to get full weights from it.

    ``matches`` tells, from the path alone (no unpickling), whether a file or folder has this layout.
    Formats are equal when their keys are: ``key`` names the layout, the rest is how it is told apart
    and explained.
    """

    key: str
    description: str = field(compare=False)
    read_by: str = field(compare=False)
    to_full_weights: str = field(compare=False)
    matches: Callable[[Path], bool] = field(compare=False, repr=False, default=lambda path: False)
    # "module:function" that reads the checkpoint at a path into a Lightning checkpoint dict whose "state_dict" holds
    # the whole model's weights (unsharded, one process, no GPU), with ``weights_only`` as torch.load takes it. Named,
    # not imported, so describing a format imports nothing; empty where the package cannot read it without a GPU.
    read_weights: str = field(compare=False, default="")
    # "module:function" called as function(source, destination, weights_only) that writes at ``destination`` one
    # Lightning checkpoint file carrying everything a resume restores: the whole weights, the optimizer states by
    # parameter name, schedulers and loop state (one process, no GPU). Empty where the package's conversion drops
    # part of it (DeepSpeed's keeps the weights alone). With it, strategies that read one file (Lightning's ddp)
    # resume this layout by ckpt_path alone (``checkpoint_io.one_file_for``).
    to_full_checkpoint: str = field(compare=False, default="")
    # The word ``lightning-strategies convert --to`` takes for this layout: the strategy family that reads it ("fsdp",
    # "deepspeed"); empty where the command writes no such layout.
    convert_name: str = field(compare=False, default="")
    # "module:function" called as function(source, destination, weights_only) that writes this layout at
    # ``destination`` from ``source``, one Lightning checkpoint file as ``to_full_checkpoint`` writes it, keeping
    # everything it holds (the ``convert`` command's way into this layout from any other). Empty where the package
    # cannot write its layout from one file without dropping part of it.
    from_full_checkpoint: str = field(compare=False, default="")
    # Glob patterns (fnmatchcase) of the top-level entries a strategy writes inside a checkpoint folder of this layout
    # from what was saved (DeepSpeed's universal form, "*-universal"): not part of the save, so writing them leaves the
    # folder's one-file form (``checkpoint_io.one_file_for``) current.
    derived: tuple[str, ...] = field(compare=False, default=())


def _is_torch_save_file(path: Path) -> bool:
    return path.is_file() and zipfile.is_zipfile(path)


FILE = CheckpointFormat(
    "file",
    "a single torch.save checkpoint file (written by ddp, by FSDP2 and ColossalAI with state_dict_type='full', "
    "and by the convert tools)",
    "every strategy that loads full weights",
    "it already holds full weights",
    _is_torch_save_file,
    read_weights="lightning_strategies.checkpoints.loading:load_weights_file",
    convert_name="full",
)


def installed_formats() -> list[CheckpointFormat]:
    """The layouts the installed strategy packages describe (``checkpoint_formats`` hook), in pluggy's call
    order (the plugin registered last first), one per key.

    A plugin whose hook fails is left out, with a log line (``hooks``): one broken package must not hide the
    others' layouts from an error message.
    """
    formats: dict[str, CheckpointFormat] = {}
    for described in plugins_of(get_registry()).checkpoint_formats().answers:
        for checkpoint_format in described:
            formats.setdefault(checkpoint_format.key, checkpoint_format)
    return list(formats.values())


def identify(path: str | Path, formats: Iterable[CheckpointFormat] | None = None) -> CheckpointFormat | None:
    """The format of the checkpoint at ``path``, or None where no known layout is there.

    ``formats`` are the layouts to try, the installed packages' by default; a single ``torch.save`` file
    is tried last, since some packages' layouts are such files too (DeepSpeed's per-rank model states).
    """
    path = Path(path)
    if not path.exists():
        return None
    for checkpoint_format in (*(installed_formats() if formats is None else formats), FILE):
        try:
            if checkpoint_format.matches(path):
                return checkpoint_format
        except OSError:  # an unreadable entry is no evidence of a layout
            continue
    return None


def earlier_checkpoint_advice(damaged: str | Path) -> str:
    """What to do instead of loading ``damaged`` (a checkpoint, or a file inside one): resume from the newest
    checkpoint saved before it beside it, named where there is one, or copy this one again."""
    checkpoint = _enclosing_checkpoint(Path(damaged))
    try:
        written = checkpoint.stat().st_mtime
        damaged_target = checkpoint.resolve()
        # A link to the damaged checkpoint (ModelCheckpoint's save_last="link") is no other checkpoint.
        earlier = [
            (path.stat().st_mtime, path)
            for path in checkpoint.parent.iterdir()
            if not path.name.startswith(".")
            and path.resolve() != damaged_target
            and path.stat().st_mtime <= written
            and identify(path) is not None
        ]
    except OSError:
        earlier = []
    if not earlier:
        return "Resume from an earlier checkpoint, or copy this one again from where it came from."
    newest = max(earlier)[1]
    return (
        f"Resume from an earlier checkpoint (the newest beside it: ckpt_path={str(newest)!r}), or copy this one "
        "again from where it came from."
    )


def _enclosing_checkpoint(path: Path, levels: int = 3) -> Path:
    """The outermost checkpoint holding ``path`` within ``levels`` folders (a ZeRO folder holds tag folders of
    per-rank files), or ``path`` itself."""
    found = path
    for candidate in [path, *path.parents][: levels + 1]:
        if identify(candidate) is not None:
            found = candidate
    return found


def foreign_checkpoint_error(path: str | Path, strategy: str, here: str) -> CheckpointError:
    """The error for a checkpoint ``strategy`` cannot read; ``here`` says what it does accept.

    Example: ``here="a DeepSpeed checkpoint folder, or one full-weights file with load_full_weights=True"``.
    """
    found = identify(path)
    if found is None:
        what = f"{path} is no checkpoint layout that the installed strategy packages know"
        fix = (
            "Check the path: it should be what a strategy's save_checkpoint (or ModelCheckpoint) wrote. If another "
            "strategy package wrote it, install that package (`lightning-strategies list` shows what is installed): "
            "it recognises its own layout and says how to convert it."
        )
    else:
        what = f"{path} is {found.description}"
        fix = f"Resume it with {found.read_by}. To load its weights here: {found.to_full_weights.format(path=path)}."
    return CheckpointError(f"{what}, and {strategy} reads {here}. {fix}")
