"""What the DCOCO corrector's walk costs per drafted block in our engine, fused against compiled
and eager, and whether the fused picks are the batched fp32 walk's.

Loads the shipped corrector (CHECKPOINT, default dcoco-joint-12k) in fp32 and times, for one
request of 1-7 slots over the shipped draft vocabulary's 16,000 columns (random hidden states and
logits: the cost does not depend on their values):
- `fused`: dcoco.models.heads.fused_walk, one C++ call (what our engine runs on a CPU);
- `compiled`: `select` compiled by inductor (dcoco.models.heads.head_compile), what it ran before;
- `eager`: `select` uncompiled.
The three run in alternation, call after call; median ms of 30 calls, ratios within this run. Then
the share of 2,000 random blocks (1 x 7 slots) whose fused picks equal the eager fp32 walk's.

Usage: .venv/bin/python scripts/reproduce/fused_walk_cost.py [CHECKPOINT]
"""

from __future__ import annotations

import sys

import torch

from dcoco.decode.cost_curve import interleaved_ms, ms_table
from dcoco.models.drafter.draft_vocab import read_ranking
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.heads.head_compile import HeadSelect
from dcoco.models.heads.head_io import load_head
from dcoco.models.target.loading import load_target
from dcoco.paths import checkpoints_dir

TARGET, COLUMNS, CALLS, SLOTS, AGREEMENT_BLOCKS = "smollm2-135m-instruct", 16000, 30, 7, 2000


def random_block(generator: torch.Generator, slots: int, width: int, columns: torch.Tensor):
    hidden = torch.randn(1, slots, width, generator=generator)
    logits = 4 * torch.randn(1, slots, COLUMNS, generator=generator)
    anchors = columns[torch.randint(0, COLUMNS, (1,), generator=generator)]
    return hidden, logits, anchors


def main(checkpoint: str) -> None:
    path = checkpoints_dir() / TARGET / checkpoint
    target = load_target(TARGET, "fp32")
    head = load_head(path, target, load_drafter(path, target))
    head.prepare_inference()
    columns = read_ranking(checkpoints_dir() / TARGET, target.config.vocab_size)[:COLUMNS]
    selects = {
        "fused": HeadSelect(head, None, columns, SLOTS, fused=True),
        "compiled": HeadSelect(head, None, columns, SLOTS, compile=True, batch_sizes=(1,)),
        "eager": HeadSelect(head, None, columns, SLOTS, compile=False),
    }
    assert selects["fused"].fused, "the fused kernels do not build here"
    generator = torch.Generator().manual_seed(0)
    width = head.config.hidden_size
    rows = {}
    with torch.inference_mode():
        for slots in range(1, SLOTS + 1):
            block = random_block(generator, slots, width, columns)
            calls = [lambda s=select, b=block: s(*b) for select in selects.values()]
            for call in calls:  # the compiled one compiles every slot count on its first call
                call()
            rows[f"1 x {slots}"] = interleaved_ms(calls, CALLS, 3)
        same = 0
        for _ in range(AGREEMENT_BLOCKS):
            block = random_block(generator, SLOTS, width, columns)
            same += int(torch.equal(selects["fused"](*block), selects["eager"](*block)))
    print(f"{checkpoint}, fp32, {COLUMNS} columns, {torch.get_num_threads()} threads: ms per walk")
    print(ms_table("requests x slots", list(selects), rows))
    ratios = [cells[1] / cells[0] for cells in rows.values()]
    print(f"fused is {min(ratios):.1f}-{max(ratios):.1f}x faster than compiled")
    print(f"fused picks equal the eager fp32 walk's on {same}/{AGREEMENT_BLOCKS} random blocks")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dcoco-joint-12k")
