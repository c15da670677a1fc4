"""Repeated runs: the order they run in, and what their results add up to (median, spread, ratios).

Pure Python, no torch: the orchestrator calls it after every run and the report reads its output.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

# A ratio of medians under this is not "at least the partner" (issue #16: 0.97 of the backend by hand).
BY_HAND_TARGET = 0.97
STEADY_SPREAD_PERCENT = 5.0  # five runs of one configuration within 5% of each other


def schedule(run_ids: list[str], repeats: Callable[[str], int]) -> list[tuple[int, str]]:
    """(repeat, run id) in the order they run: round by round, each round every run that still has
    repeats in the order given (by hand, ours, built-in, by hand, ...), so a drift of the machine over
    the session (clocks, temperature, page cache) touches every run alike rather than the last ones."""
    rounds = max((repeats(run_id) for run_id in run_ids), default=0)
    return [(round_, run_id) for round_ in range(1, rounds + 1) for run_id in run_ids if repeats(run_id) >= round_]


def spread_percent(values: list[float]) -> float | None:
    """(highest - lowest) / lowest, in percent: "within 5% of each other" means at most 5."""
    if len(values) < 2:
        return None
    return 100 * (max(values) - min(values)) / min(values)


def median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def aggregate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run id, size and device count, in the order first met: how many repeats were
    measured and failed, median tokens/s and its spread, the checkpoint's cost, and the ratios of
    medians to the by-hand partner and to Lightning's built-in strategy of the same name."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["run"], record["size"], record["devices"]), []).append(record)
    rows = []
    for (run, size, devices), group in groups.items():
        ok = [record for record in group if record["status"] == "ok"]
        speeds = [record["tokens_per_second"] for record in ok]
        rows.append(
            {
                "run": run,
                "kind": group[0]["kind"],
                "partner": group[0].get("partner"),
                "size": size,
                "devices": devices,
                "precision": group[0]["precision"],
                "repeats": len(group),
                "measured": len(ok),
                "failures": sorted({record["failure"]["reason"] for record in group if record["status"] == "failed"}),
                "tokens_per_second": speeds,
                "median_tokens_per_second": median(speeds),
                "min_tokens_per_second": min(speeds) if speeds else None,
                "max_tokens_per_second": max(speeds) if speeds else None,
                "spread_percent": spread_percent(speeds),
                "median_checkpoint_seconds": median([record.get("checkpoint_seconds") for record in ok]),
                "median_end_to_end_seconds": median([record.get("end_to_end_seconds") for record in ok]),
                "median_tokens_per_second_with_checkpoint": median(
                    [record.get("tokens_per_second_with_checkpoint") for record in ok]
                ),
                "median_setup_seconds": median([record.get("setup_seconds") for record in ok]),
                "median_gc_seconds": median([record.get("gc_seconds") for record in ok]),
                "longest_step_over_median": median([longest_over_median(record.get("step_seconds")) for record in ok]),
                # Each run's, beside tokens_per_second: whether the slow runs were the ones bound by the host.
                "main_thread_busy": [record.get("main_thread_busy") for record in ok],
            }
        )
    by_id = {(row["run"], row["size"], row["devices"]): row for row in rows}
    for row in rows:
        row["vs_by_hand"] = ratio(row, by_id.get((row["partner"], row["size"], row["devices"])))
        built_in = f"lightning:{row['run'].split(':', 1)[1]}" if row["kind"] == "trainer" else None
        row["vs_built_in"] = ratio(row, by_id.get((built_in, row["size"], row["devices"])))
        row["vs_by_hand_with_checkpoint"] = ratio(
            row, by_id.get((row["partner"], row["size"], row["devices"])), "median_tokens_per_second_with_checkpoint"
        )
    return rows


def ratio(row: dict[str, Any], other: dict[str, Any] | None, field: str = "median_tokens_per_second") -> float | None:
    if other is None or row["run"] == other["run"] or not row.get(field) or not other.get(field):
        return None
    return row[field] / other[field]


def longest_over_median(step_seconds: list[float] | None) -> float | None:
    """The slowest timed step over the median one (host-side times): near 1 when the steps are even,
    large when one step stalled (a collection, an allocator retry, a synchronisation)."""
    if not step_seconds:
        return None
    middle = statistics.median(step_seconds)
    return max(step_seconds) / middle if middle > 0 else None


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of docs/benchmarks.md for repeated runs."""
    lines = [
        "| run | size | devices | runs | median tokens/s | lowest to highest | spread | vs by hand | vs built-in "
        "| checkpoint (s) | steps + checkpoint, vs by hand | longest step / median |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        runs = f"{row['measured']}/{row['repeats']}" + (f" ({', '.join(row['failures'])})" if row["failures"] else "")
        if row["median_tokens_per_second"] is None:
            lines.append(f"| `{row['run']}` | {row['size']} | {row['devices']} | {runs} | | | | | | | | |")
            continue
        spread = row["spread_percent"]
        flag = " (not steady)" if spread is not None and spread > STEADY_SPREAD_PERCENT else ""
        lines.append(
            f"| `{row['run']}` | {row['size']} | {row['devices']} | {runs} | {row['median_tokens_per_second']:,.0f} "
            f"| {row['min_tokens_per_second']:,.0f} to {row['max_tokens_per_second']:,.0f} "
            f"| {'' if spread is None else f'{spread:.1f}%'}{flag} | {number(row['vs_by_hand'])} "
            f"| {number(row['vs_built_in'])} | {number(row['median_checkpoint_seconds'], 1)} "
            f"| {number(row['vs_by_hand_with_checkpoint'])} | {number(row['longest_step_over_median'])} |"
        )
    return lines


def number(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"
