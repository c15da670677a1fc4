"""Makes ``python -m tools.benchmark`` the same as ``python tools/benchmark/cli.py``."""

from tools.benchmark.cli import main

main()
