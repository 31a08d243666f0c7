"""DCOCO's ratios to plain and to dflash in each of several `bench_serve.sh` runs, and their mean
over the runs (issue 29's bar).

A run's servers share its minutes, so within a run the ratio of method means is fair; between
runs the machine's speed moves (plain at 4 streams: 104.6 tokens/s in one run, 116.5 in the one
before), so servers of different runs are not pooled into one mean: each run gives its ratio
(mean of `dcoco`'s servers over the mean of the other method's), and the runs' ratios are
averaged. A run without one of the two methods at a level gives no ratio there.

Usage: .venv/bin/python scripts/reproduce/serving_run_ratios.py RESULT_DIR [RESULT_DIR ...]
  (each holding <label>/bench_serve.json, as `INTERLEAVE=1 bench_serve.sh` writes)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

OURS, OTHERS = "dcoco", ("plain", "dflash")


def method_rates(run: Path) -> dict[tuple[str, float, int], float]:
    """(method, T, streams) -> the mean output tokens/s of the run's servers of that method."""
    rates: dict[tuple[str, float, int], list[float]] = {}
    for file in sorted(run.glob("*/bench_serve.json")):
        result = json.loads(file.read_text())
        method = result["label"].partition("@")[0].split("~")[0]
        for level in result["levels"]:
            key = (method, level["temperature"], level["concurrency"])
            rates.setdefault(key, []).append(level["output_tok_s"])
    return {key: statistics.mean(values) for key, values in rates.items()}


def main(runs: list[Path]) -> None:
    per_run = [method_rates(run) for run in runs]
    levels = sorted({(t, c) for rates in per_run for (m, t, c) in rates if m == OURS})
    for other in OTHERS:
        print(f"\n`dcoco` over {other}: per run ({', '.join(run.name for run in runs)}), mean")
        print("| T | streams | per run | mean |\n|--:|--:|---|--:|")
        for t, c in levels:
            ratios = [
                rates[(OURS, t, c)] / rates[(other, t, c)]
                for rates in per_run
                if (OURS, t, c) in rates and (other, t, c) in rates
            ]
            if ratios:
                shown = " / ".join(f"{r:.3f}" for r in ratios)
                print(f"| {t:g} | {c} | {shown} | {statistics.mean(ratios):.3f} |")


if __name__ == "__main__":
    main([Path(argument) for argument in sys.argv[1:]])
