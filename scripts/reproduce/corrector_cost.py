"""What the DCOCO corrector's selection costs per drafted block, by batch size and candidate count.

Loads the shipped corrector (CHECKPOINT, default dcoco-joint-12k) at each precision and times
`select` on one drafted block per request (7 slots, random drafter hidden states and logits over
the whole vocabulary; the cost does not depend on their values) for 1-32 requests:
- `inference`: as the engine and the vLLM plugin run it (no autograd: the grid in cache-sized
  chunks, the embedding projections gathered from their vocabulary tables), at the trained top-k
  and at the fewer candidates `greedy/K` walks;
- `training form`: the same scores through the autograd form (grad on), which is how inference
  ran before the chunked grid and the tables.
Prints the median milliseconds of 15 calls per cell; ratios are within this one run.

Usage: .venv/bin/python scripts/reproduce/corrector_cost.py [CHECKPOINT] [K,K,...] [DTYPE,...]
  (defaults: dcoco-joint-12k 16,8,4 fp32,bf16)
"""

from __future__ import annotations

import functools
import statistics
import sys
import time

import torch

from dcoco.models.drafter_io import load_drafter
from dcoco.models.head_io import load_head
from dcoco.models.loading import load_target
from dcoco.paths import checkpoints_dir

TARGET, SLOTS, BATCHES, CALLS = "smollm2-135m-instruct", 7, (1, 4, 8, 16, 32), 15


def median_ms(call) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(checkpoint: str, counts: list[int], dtypes: list[str]) -> None:
    path = checkpoints_dir() / TARGET / checkpoint
    print(f"{checkpoint}: ms per select, {SLOTS} slots, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print("| dtype | path | " + " | ".join(f"{b} req" for b in BATCHES) + " |")
    print("|---|---|" + "--:|" * len(BATCHES))
    for dtype in dtypes:
        target = load_target(TARGET, dtype)
        head = load_head(path, target, load_drafter(path, target))
        generator = torch.Generator().manual_seed(0)
        blocks = {
            b: (
                torch.randn(b, SLOTS, head.config.hidden_size, generator=generator),
                4 * torch.randn(b, SLOTS, target.config.vocab_size, generator=generator),
                torch.randint(0, target.config.vocab_size, (b,), generator=generator),
            )
            for b in BATCHES
        }
        blocks = {b: tuple(t.to(target.dtype) if t.is_floating_point() else t for t in block)
                  for b, block in blocks.items()}  # fmt: skip
        trained = head.config.top_k  # plain `greedy` walks it (and runs on older trees)
        walks = {k: "greedy" if k == trained else f"greedy/{k}" for k in counts}
        rows = [(f"inference, greedy/{k}", torch.no_grad, walk) for k, walk in walks.items()]
        rows.append((f"training form, greedy/{trained}", torch.enable_grad, "greedy"))
        for name, mode, selection in rows:
            cells = []
            for b in BATCHES:
                with mode():
                    call = functools.partial(head.select, *blocks[b], selection=selection)
                    cells.append(median_ms(call))
            print(f"| {dtype} | {name} | " + " | ".join(f"{ms:.2f}" for ms in cells) + " |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        arguments[0] if arguments else "dcoco-joint-12k",
        [int(k) for k in (arguments[1] if len(arguments) > 1 else "16,8,4").split(",")],
        (arguments[2] if len(arguments) > 2 else "fp32,bf16").split(","),
    )
