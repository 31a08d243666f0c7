"""Every timed cycle of `dcoco compare` under `--num-draft-tokens auto`, summed by context mode:
drafting cycles against plain ones (k = 0), in tokens per ms, beside what auto chose.

The draft-length policy (dcoco.decode.draft_length) stops drafting in a mode whose drafting cycles
measure below plain's; this shows whether the cycles it ran bear that out, over the whole run. It
wraps DraftLengthPolicy._observe_cycle to record (mode, drafting, tokens, ms) and passes its other
arguments to `dcoco compare` (default: the demo's prompts, plain and dflash, 128 tokens).

Usage: .venv/bin/python scripts/reproduce/cycle_trace.py [compare flags]
"""

from __future__ import annotations

import collections
import sys

import dcoco.decode.draft_length as draft_length
from dcoco.cli import main as dcoco

DEFAULT = ["--methods", "plain,dflash", "--max-new-tokens", "128"]


def main() -> None:
    cycles: list[tuple[str, bool, int, float]] = []
    observe = draft_length.DraftLengthPolicy._observe_cycle

    def traced(policy, counts, drafting, tokens, draft_s, verify_s, cycle_s):
        mode = next((m for m, c in policy.modes.items() if c is counts), None)
        name = draft_length._mode_name(mode) if mode is not None else "?"
        cycles.append((name, drafting, tokens, cycle_s * 1000))
        return observe(policy, counts, drafting, tokens, draft_s, verify_s, cycle_s)

    draft_length.DraftLengthPolicy._observe_cycle = traced
    dcoco(["compare", *(sys.argv[1:] or DEFAULT)])
    totals: dict = collections.defaultdict(lambda: [0, 0, 0.0])
    for name, drafting, tokens, ms in cycles:
        total = totals[(name, "drafting" if drafting else "plain")]
        total[0], total[1], total[2] = total[0] + 1, total[1] + tokens, total[2] + ms
    print("| mode | cycles | count | tokens | ms | tokens/ms |")
    print("|---|---|--:|--:|--:|--:|")
    for (name, kind), (count, tokens, ms) in sorted(totals.items()):
        print(f"| {name} | {kind} | {count} | {tokens} | {ms:.0f} | {tokens / ms:.4f} |")


if __name__ == "__main__":
    main()
