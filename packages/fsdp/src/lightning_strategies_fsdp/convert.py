"""Convert between sharded (DCP folder) and full (single file) checkpoints, without GPUs or a process group.

    python -m lightning_strategies_fsdp.convert SOURCE DESTINATION

The direction follows SOURCE: a sharded checkpoint folder becomes a full file, a full file
becomes a sharded folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_strategies_fsdp.checkpoint import (
    CheckpointFormatError,
    check_checkpoint_path,
    full_to_sharded,
    is_sharded_checkpoint,
    sharded_to_full,
)


def convert(source: str | Path, destination: str | Path) -> Path:
    """Convert ``source`` into the other format at ``destination`` and return ``destination``."""
    source = Path(source)
    check_checkpoint_path(source)
    if is_sharded_checkpoint(source):
        return sharded_to_full(source, destination)
    return full_to_sharded(source, destination)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_strategies_fsdp.convert",
        description="Convert a sharded FSDP checkpoint folder into a full checkpoint file, or the reverse.",
    )
    parser.add_argument("source", help="a sharded checkpoint folder or a full checkpoint file")
    parser.add_argument("destination", help="where to write the converted checkpoint")
    args = parser.parse_args(argv)
    try:
        written = convert(args.source, args.destination)
    except (CheckpointFormatError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    kind = "sharded checkpoint folder" if is_sharded_checkpoint(written) else "full checkpoint file"
    print(f"wrote {kind} {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
