"""Command line for checkpoint conversion: ``python -m lightning_strategies_deepspeed.convert``.

python -m lightning_strategies_deepspeed.convert CHECKPOINT_DIR OUTPUT.ckpt
    one Lightning checkpoint with a plain fp32 state dict (no DeepSpeed needed to load it)
python -m lightning_strategies_deepspeed.convert --universal CHECKPOINT_DIR OUTPUT_DIR
    DeepSpeed's universal checkpoint, to resume on a different number of devices

Lightning's state is read with weights_only=True; --trust-pickles reads a file you trust whose
state holds pickled objects (custom hyperparameters, for example).
"""

from __future__ import annotations

import argparse
import sys

from lightning_strategies import CheckpointError
from lightning_strategies_deepspeed.checkpoint import convert_to_universal, convert_zero_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_strategies_deepspeed.convert",
        description="Convert a DeepSpeed checkpoint saved by lightning-strategies-deepspeed.",
    )
    parser.add_argument("checkpoint", help="the checkpoint directory the strategy saved (or its tag folder)")
    parser.add_argument("output", help="the file to write (or, with --universal, the directory)")
    parser.add_argument("--universal", action="store_true", help="write a universal checkpoint instead of one file")
    parser.add_argument(
        "--trust-pickles",
        action="store_true",
        help="read Lightning's state with weights_only=False (pickled objects): only for files you trust",
    )
    arguments = parser.parse_args(argv)
    try:
        if arguments.universal:
            convert_to_universal(arguments.checkpoint, arguments.output)
        else:
            weights_only = False if arguments.trust_pickles else None
            converted = convert_zero_checkpoint(arguments.checkpoint, arguments.output, weights_only=weights_only)
            print(f"wrote {arguments.output}: {len(converted['state_dict'])} tensors")
    except (CheckpointError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
