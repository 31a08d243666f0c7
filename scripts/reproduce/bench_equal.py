"""Whether two `dcoco bench` runs decoded the same: for every method, temperature and prompt turn,
the same new tokens, cycles and accepted drafts per slot (so the same τ); timings are ignored.

A restructuring that changes no behaviour must pass this on a fixed-seed run made before and after
it (same flags, `--num-draft-tokens N` and a fixed `--dtype`, so no timing picks a setting).
Usage: .venv/bin/python scripts/reproduce/bench_equal.py RUN_BEFORE RUN_AFTER   (exit 1 if not)
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

COMPARED = ("new_ids", "cycles", "accepted_per_slot", "reached_per_slot")


def samples(run: Path) -> dict[tuple, dict]:
    """(method, temperature, suite, id, turn) -> the sample's record."""
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line]
    return {(r["method"], r["temperature"], r["suite"], r["id"], r["turn"]): r for r in rows}


def compare(before: Path, after: Path) -> tuple[list[str], list[str]]:
    """(one table row per method and temperature, the differences found)."""
    first, second = samples(before), samples(after)
    problems = [f"only in one run: {key}" for key in sorted(set(first) ^ set(second))]
    taus = defaultdict(lambda: [0, 0, 0, 0])  # tokens, cycles (before), tokens, cycles (after)
    for key in sorted(set(first) & set(second)):
        a, b = first[key], second[key]
        problems += [f"{key}: {field} differs" for field in COMPARED if a[field] != b[field]]
        row = taus[key[:2]]
        row[0] += a["new_tokens"]
        row[1] += a["cycles"]
        row[2] += b["new_tokens"]
        row[3] += b["cycles"]
    rows = [
        f"| {method} | {t:g} | {row[0]} | {row[0] / row[1]:.4f} | {row[2] / row[3]:.4f} |"
        for (method, t), row in taus.items()
    ]
    return rows, problems


def main(before: str, after: str) -> int:
    rows, problems = compare(Path(before), Path(after))
    print("| method | T | new tokens | τ pooled before | τ pooled after |")
    print("|---|--:|--:|--:|--:|")
    print("\n".join(rows))
    for problem in problems:
        print(f"DIFFERS: {problem}")
    print("same tokens and τ for every method" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
