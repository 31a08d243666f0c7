"""DCOCO's ratios to plain and to dflash in each of several `bench_serve.sh` runs, and their mean
over the runs (issue 29's bar).

A run's servers share its minutes, so within a run the ratio of method means is fair; between
runs the machine's speed moves (plain at 4 streams: 104.6 tokens/s in one run, 116.5 in the one
before), so servers of different runs are not pooled into one mean: each run gives its ratio
(mean of `dcoco`'s servers over the mean of the other method's), and the runs' ratios are
averaged, with their standard error (the runs' standard deviation over the square root of their
count): a mean within about two standard errors of a bar is not told apart from it by these runs.
A run without one of the two methods at a level gives no ratio there.

Usage: .venv/bin/python scripts/reproduce/serving_run_ratios.py RESULT_DIR [RESULT_DIR ...]
  (each holding <label>/bench_serve.json, as `INTERLEAVE=1 bench_serve.sh` writes)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from dcoco.eval.served.report import method_rates

OURS, OTHERS = "dcoco", ("plain", "dflash")


def run_rates(run: Path) -> dict[tuple[str, float], dict[int, float]]:
    """(row, T) -> {streams: tokens/s}: the run's servers of a row at their mean, as the compare
    report reads them (a server with flags of its own is a row of its own)."""
    results = [json.loads(file.read_text()) for file in sorted(run.glob("*/bench_serve.json"))]
    return method_rates(results)


def main(runs: list[Path]) -> None:
    per_run = [run_rates(run) for run in runs]
    levels = sorted(
        {(t, c) for rates in per_run for (row, t), by_level in rates.items() if row == OURS
         for c in by_level}
    )  # fmt: skip
    for other in OTHERS:
        print(f"\n`dcoco` over {other}: per run ({', '.join(run.name for run in runs)}), mean")
        print("| T | streams | per run | mean | standard error |\n|--:|--:|---|--:|--:|")
        for t, c in levels:
            ratios = [
                rates[(OURS, t)][c] / rates[(other, t)][c]
                for rates in per_run
                if c in rates.get((OURS, t), {}) and c in rates.get((other, t), {})
            ]
            if ratios:
                shown = " / ".join(f"{r:.3f}" for r in ratios)
                error = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None
                cell = "–" if error is None else f"{error:.3f}"
                print(f"| {t:g} | {c} | {shown} | {statistics.mean(ratios):.3f} | {cell} |")


if __name__ == "__main__":
    main([Path(argument) for argument in sys.argv[1:]])
