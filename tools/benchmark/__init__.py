"""One command that measures what each training strategy costs, next to the same backend driven by hand.

Run from the repository root: ``python -m tools.benchmark run --preset issue`` (or
``python tools/benchmark/cli.py ...``); ``python -m tools.benchmark report`` turns the results in
docs/results/ into docs/benchmarks.md. README.md in this folder describes the measurements.
"""
