"""What dcoco.models.cpu.row_reduce saves: torch's CPU `argmax` and `topk` against `row_argmax` and
`row_topk` over rows of a drafter's logits (random values; the cost does not depend on them), at
the row counts a drafter gives (1-32 requests x 1-7 slots) and the widths it searches (SmolLM2's
16,000-column draft vocabulary and its 49,152 tokens). The variants of a shape run in alternation,
call after call; prints the median µs of 30 calls, ratios within this one run.

Usage: .venv/bin/python scripts/reproduce/row_reduce_cost.py [ROWS,...] (default 1,7,32,64)
"""

from __future__ import annotations

import sys

import torch

from dcoco.decode.cost_curve import interleaved_ms
from dcoco.models.cpu.row_reduce import row_argmax, row_topk

CALLS = 30


def main(row_counts: list[int]) -> None:
    generator = torch.Generator().manual_seed(0)
    print(f"µs per call, {torch.get_num_threads()} threads")
    print("| rows x columns | argmax bf16 | row_argmax bf16 | topk(16) fp32 | row_topk(16) fp32 |")
    print("|---|--:|--:|--:|--:|")
    for columns in (16000, 49152):
        for rows in row_counts:
            logits = (4 * torch.randn(rows, columns, generator=generator)).bfloat16()
            assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))
            cells = " | ".join(f"{ms * 1e3:.0f}" for ms in interleaved_ms(_calls(logits), CALLS, 3))
            print(f"| {rows} x {columns} | {cells} |", flush=True)


def _calls(logits: torch.Tensor) -> list:
    floats = logits.float()
    return [
        lambda: logits.argmax(dim=-1),
        lambda: row_argmax(logits),
        lambda: floats.topk(16, dim=-1),
        lambda: row_topk(floats, 16),
    ]


if __name__ == "__main__":
    main([int(n) for n in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 7, 32, 64])
