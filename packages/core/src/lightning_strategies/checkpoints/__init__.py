"""Checkpoints for strategy authors, one concern per module, every name here part of the supported API.

- ``staging``: saves that survive a crash mid-save (``staged_save`` publishes with one atomic rename).
- ``loading``: ``load_file`` and ``check_file``, whose errors name the problem and the fix.
- ``formats``: what a checkpoint on disk is (``identify``, asking each package's ``checkpoint_formats`` hook),
  and the error for another strategy's.
- ``checkpoint_io``: the same for checkpoints written through Lightning's CheckpointIO plugins.
- ``fabric_layout``: one checkpoint file in the Trainer's layout or under the keys of a Fabric state.
- ``optimizer_keys``: optimizer states keyed by parameter name from those torch keys by position, and param
  groups of one Adam-family optimizer for another.
- ``scratch``: conversions' scratch folders (those of killed conversions removed), the fingerprint of a source, and
  the lock that makes jobs converting one checkpoint take turns.
- ``rank_zero``: work on a checkpoint that global rank 0 does for every rank, its failure raised on all of them,
  and a form of a checkpoint it makes for every rank to load.

Import from ``lightning_strategies.checkpoints``; the modules' other names may change.
"""

from lightning_strategies.checkpoints.checkpoint_io import (
    check_checkpoint_file,
    check_trainer_checkpoint,
    convert_once,
    kept_form,
    one_file_for,
    one_file_here,
    reads_torch_save_files,
    remove_checkpoint_path,
    source_record,
    staged_checkpoint_io_save,
    weights_only_keyword,
)
from lightning_strategies.checkpoints.fabric_layout import as_fabric_layout, as_trainer_layout, saved_entry
from lightning_strategies.checkpoints.formats import (
    FILE,
    CheckpointFormat,
    earlier_checkpoint_advice,
    foreign_checkpoint_error,
    identify,
)
from lightning_strategies.checkpoints.loading import check_file, load_file
from lightning_strategies.checkpoints.optimizer_keys import adopted_param_groups, keyed_by_name
from lightning_strategies.checkpoints.rank_zero import check_seen, form_for_the_load, on_rank_zero
from lightning_strategies.checkpoints.scratch import (
    files_fingerprint,
    new_scratch,
    one_conversion_at_a_time,
    read_record,
    scratch_folder,
)
from lightning_strategies.checkpoints.staging import (
    STAGING_FOLDER,
    cannot_write,
    every_rank_left,
    is_local,
    publish,
    recover,
    recover_before_load,
    remove,
    staged_save,
    staging_path,
)

__all__ = [
    "FILE",
    "STAGING_FOLDER",
    "CheckpointFormat",
    "adopted_param_groups",
    "as_fabric_layout",
    "as_trainer_layout",
    "cannot_write",
    "check_checkpoint_file",
    "check_file",
    "check_seen",
    "check_trainer_checkpoint",
    "convert_once",
    "earlier_checkpoint_advice",
    "every_rank_left",
    "files_fingerprint",
    "foreign_checkpoint_error",
    "form_for_the_load",
    "identify",
    "is_local",
    "kept_form",
    "keyed_by_name",
    "load_file",
    "new_scratch",
    "on_rank_zero",
    "one_conversion_at_a_time",
    "one_file_for",
    "one_file_here",
    "publish",
    "read_record",
    "reads_torch_save_files",
    "recover",
    "recover_before_load",
    "remove",
    "remove_checkpoint_path",
    "saved_entry",
    "scratch_folder",
    "source_record",
    "staged_checkpoint_io_save",
    "staged_save",
    "staging_path",
    "weights_only_keyword",
]
