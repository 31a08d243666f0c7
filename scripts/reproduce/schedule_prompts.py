"""Held-out prompts for `dcoco serve --schedule-prompts`: suite records the bench does not send.

`dcoco bench-serve --limit N` sends a fixed sample of N prompts per suite. The draft schedule is
best timed on traffic like the server's, but not on the requests it is then benchmarked with: this
writes the first PER_SUITE records of each suite outside that sample, as they are in the suite
files (the bench's --prompts format), to OUT.

Usage: .venv/bin/python scripts/reproduce/schedule_prompts.py OUT [LIMIT] [PER_SUITE] [SUITES]
  (reads ../shared/data or DCOCO_DATA_DIR; defaults 2, 10, gsm8k,humaneval,mtbench)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dcoco.eval.suites import load_prompts
from dcoco.paths import data_dir


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    limit = int(argv[1]) if len(argv) > 1 else 2
    per_suite = int(argv[2]) if len(argv) > 2 else 10
    suites = argv[3] if len(argv) > 3 else "gsm8k,humaneval,mtbench"
    benched = {prompt.id for prompt in load_prompts(str(data_dir()), "", suites, limit)}
    lines = []
    for suite in suites.split(","):
        records = (json.loads(line) for line in (data_dir() / f"{suite}.jsonl").open())
        held_out = [r for r in records if r.get("id") not in benched]
        lines += [json.dumps(record) for record in held_out[:per_suite]]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} held-out prompts -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
