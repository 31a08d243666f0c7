"""What the DCOCO corrector's selection costs per drafted block, by batch size and candidate count.

Loads the shipped corrector (CHECKPOINT, default dcoco-joint-12k) at each precision and times
`select` on one drafted block per request (7 slots, random drafter hidden states and logits over
the whole vocabulary; the cost does not depend on their values) for 1-32 requests:
- `inference`: as the engine and the vLLM plugin run it (no autograd: the embedding projections
  gathered from their vocabulary tables; the walk's rows from WALK_MIN_K candidates or
  WALK_MIN_CELLS transitions on, the whole grid in cache-sized chunks below), at the trained
  top-k and at the fewer candidates `greedy/K` walks; `(grid)` and `(walk)` force one of the
  two at every size;
- `training form`: the same scores through the autograd form (grad on), which is how inference
  ran before the chunked grid and the tables.
The variants of one cell run in alternation, call after call, so load elsewhere on the machine
hits them alike. Prints the median milliseconds of 15 calls; ratios are within this one run.

Usage: .venv/bin/python scripts/reproduce/corrector_cost.py [CHECKPOINT] [K,K,...] [DTYPE,...]
  (defaults: dcoco-joint-12k 16,8,4 fp32,bf16)
"""

from __future__ import annotations

import sys

import torch

import dcoco.models.heads.grid_parts as grid_parts
from dcoco.decode.cost_curve import interleaved_ms
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.heads.head_io import load_head
from dcoco.models.target.loading import load_target
from dcoco.paths import checkpoints_dir

TARGET, SLOTS, BATCHES, CALLS = "smollm2-135m-instruct", 7, (1, 4, 8, 16, 32), 15


def variant(head, block, selection: str, grad: bool, walk_from: tuple[float, float]):
    """One way to run `select`: autograd on or off, the walk from `walk_from` = (candidates,
    transitions) on."""

    def call():
        grid_parts.WALK_MIN_K, grid_parts.WALK_MIN_CELLS = walk_from
        with torch.enable_grad() if grad else torch.no_grad():
            head.select(*block, selection=selection)

    return call


def random_blocks(head, target) -> dict[int, tuple]:
    generator = torch.Generator().manual_seed(0)
    blocks = {}
    for b in BATCHES:
        hidden = torch.randn(b, SLOTS, head.config.hidden_size, generator=generator)
        logits = 4 * torch.randn(b, SLOTS, target.config.vocab_size, generator=generator)
        anchors = torch.randint(0, target.config.vocab_size, (b,), generator=generator)
        blocks[b] = (hidden.to(target.dtype), logits.to(target.dtype), anchors)
    return blocks


def main(checkpoint: str, counts: list[int], dtypes: list[str]) -> None:
    path = checkpoints_dir() / TARGET / checkpoint
    print(f"{checkpoint}: ms per select, {SLOTS} slots, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print("| dtype | path | " + " | ".join(f"{b} req" for b in BATCHES) + " |")
    print("|---|---|" + "--:|" * len(BATCHES))
    default = (grid_parts.WALK_MIN_K, grid_parts.WALK_MIN_CELLS)
    for dtype in dtypes:
        target = load_target(TARGET, dtype)
        head = load_head(path, target, load_drafter(path, target))
        blocks = random_blocks(head, target)
        trained = head.config.top_k  # plain `greedy` walks it (and runs on older trees)
        for k in counts:
            walk = "greedy" if k == trained else f"greedy/{k}"
            never, always = (float("inf"),) * 2, (0, 0)
            forced = (("", default), (" (grid)", never), (" (walk)", always))
            rows = [(f"inference{how}, greedy/{k}", False, least) for how, least in forced]
            if k == trained:
                rows.append((f"training form, greedy/{k}", True, default))
            cells = [
                interleaved_ms(
                    [variant(head, blocks[b], walk, g, least) for _, g, least in rows], CALLS, 3
                )
                for b in BATCHES
            ]
            for i, (name, _, _) in enumerate(rows):
                print(f"| {dtype} | {name} | " + " | ".join(f"{c[i]:.2f}" for c in cells) + " |",
                      flush=True)  # fmt: skip
    grid_parts.WALK_MIN_K, grid_parts.WALK_MIN_CELLS = default


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        arguments[0] if arguments else "dcoco-joint-12k",
        [int(k) for k in (arguments[1] if len(arguments) > 1 else "16,8,4").split(",")],
        (arguments[2] if len(arguments) > 2 else "fp32,bf16").split(","),
    )
