"""Command line for checkpoint conversion: ``python -m lightning_strategies_deepspeed.convert``.

python -m lightning_strategies_deepspeed.convert CHECKPOINT_DIR OUTPUT.ckpt
    one Lightning checkpoint with a plain fp32 state dict (no DeepSpeed needed to load it)
python -m lightning_strategies_deepspeed.convert --universal CHECKPOINT_DIR OUTPUT_DIR
    DeepSpeed's universal checkpoint, to resume on a different number of devices
"""

from __future__ import annotations

import argparse
import sys

from lightning_strategies_deepspeed.checkpoint import convert_to_universal, convert_zero_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_strategies_deepspeed.convert",
        description="Convert a DeepSpeed checkpoint saved by lightning-strategies-deepspeed.",
    )
    parser.add_argument("checkpoint", help="the checkpoint directory the strategy saved (or its tag folder)")
    parser.add_argument("output", help="the file to write (or, with --universal, the directory)")
    parser.add_argument("--universal", action="store_true", help="write a universal checkpoint instead of one file")
    arguments = parser.parse_args(argv)
    try:
        if arguments.universal:
            convert_to_universal(arguments.checkpoint, arguments.output)
        else:
            converted = convert_zero_checkpoint(arguments.checkpoint, arguments.output)
            print(f"wrote {arguments.output}: {len(converted['state_dict'])} tensors")
    except (FileNotFoundError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
