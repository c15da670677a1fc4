"""Entry point of one conformance run: ``python -m lightning_strategies.conformance``.

Every rank runs this module (Lightning's launcher re-executes it for ranks > 0) and writes its
own report file, so a failing rank never has to reach a collective to be heard.
"""

from __future__ import annotations

import argparse
import json

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies.conformance.suite import (
    ConformanceSuite,
    SuiteOptions,
    current_rank,
    quiet_lightning,
    rank_report_path,
    results_as_dicts,
    run_parser,
)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = run_parser("python -m lightning_strategies.conformance")
    parser.add_argument("--report", required=True, help="prefix of the per-rank JSON report files")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    quiet_lightning()
    results = ConformanceSuite(SuiteOptions.from_arguments(arguments)).run()
    with open(rank_report_path(arguments.report, current_rank()), "w") as handle:
        json.dump(results_as_dicts(results), handle, indent=1)
    end_process_group()  # before exit, so that gloo's threads cannot abort a run that passed
    return 0 if all(result.passed for result in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
