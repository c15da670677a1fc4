"""Convert between sharded (DCP folder) and full (single file) checkpoints, without GPUs or a process group.

    python -m lightning_strategies_fsdp.convert SOURCE DESTINATION [--no-weights-only]

The direction follows SOURCE: a sharded checkpoint folder becomes a full file, a full file
becomes a sharded folder. DESTINATION appears only once completely written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_strategies import CheckpointError
from lightning_strategies_fsdp.checkpoint import full_to_sharded, sharded_to_full
from lightning_strategies_fsdp.validation import check_checkpoint_path, is_sharded_checkpoint


def convert(source: str | Path, destination: str | Path, weights_only: bool | None = None) -> Path:
    """Convert ``source`` into the other format at ``destination`` and return ``destination``."""
    source = Path(source)
    check_checkpoint_path(source)
    if is_sharded_checkpoint(source):
        return sharded_to_full(source, destination, weights_only)
    return full_to_sharded(source, destination, weights_only)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_strategies_fsdp.convert",
        description="Convert a sharded FSDP checkpoint folder into a full checkpoint file, or the reverse.",
    )
    parser.add_argument("source", help="a sharded checkpoint folder or a full checkpoint file")
    parser.add_argument("destination", help="where to write the converted checkpoint")
    parser.add_argument(
        "--weights-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read pickled data as torch.load(weights_only=...) does (default: torch's default, True); "
        "--no-weights-only reads any object, for checkpoints you trust",
    )
    args = parser.parse_args(argv)
    try:
        written = convert(args.source, args.destination, args.weights_only)
    except (CheckpointError, IsADirectoryError) as error:
        print(f"error: {error}", file=sys.stderr)
        if "weights_only" in str(error):
            print("With this command: add --no-weights-only.", file=sys.stderr)
        return 2
    kind = "sharded checkpoint folder" if is_sharded_checkpoint(written) else "full checkpoint file"
    print(f"wrote {kind} {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
