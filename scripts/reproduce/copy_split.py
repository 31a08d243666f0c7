"""Where the drafter loses to copying: teacher-forced slot-1 accuracy at the reply positions where
the context has a 3- or 2-token match (a copy hint, dcoco.models.drafter.copy_hints) and where it
has none, next to the hint's own accuracy; per suite for a bench run's plain T=0 replies, else on
the corpus's held-out split (the blocks `dcoco heldout` uses).

Usage: .venv/bin/python scripts/reproduce/copy_split.py CHECKPOINT [BENCH_RUN_DIR]
"""

from __future__ import annotations

import sys

import torch

from dcoco.data.distill import load_corpus, split_heldout
from dcoco.eval.bench_corpus import bench_samples
from dcoco.models.drafter.copy_hints import NO_HINT
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.target.loading import DEFAULT_TARGET, load_target
from dcoco.paths import default_corpus
from dcoco.train.block_pass import AnchorRule, block_chunks, copy_hints_of, prepare_item
from dcoco.train.target_features import TargetFeatures


def main(checkpoint: str, bench_run: str | None) -> None:
    target = load_target(DEFAULT_TARGET, "bf16")
    drafter = load_drafter(checkpoint, target, dtype=torch.float32)
    if bench_run:  # every reply position of plain's replies
        samples, anchors = bench_samples(bench_run, target), 1 << 30
    else:  # the held-out split and anchors of `dcoco heldout`
        samples, anchors = split_heldout(load_corpus(default_corpus(DEFAULT_TARGET)), 32)[1], 64
    features = TargetFeatures(target, drafter.config.target_layer_ids)
    block = drafter.config.block_size
    generator = torch.Generator().manual_seed(0)
    counts: dict[tuple[str, bool], list[int]] = {}  # (suite, hinted) -> [blocks, drafter, hint]
    with torch.no_grad():
        for sample in samples:
            if len(sample.response_ids) < block:
                continue
            item = prepare_item(sample, features, AnchorRule(anchors), block, generator, 0, "cpu")
            hints = copy_hints_of(item, block)[:, 0]  # [blocks]
            chunks = block_chunks(drafter, item, 32)
            slot1 = [drafter.logits(c.hidden, c.hint_ids)[:, 0].argmax(-1) for c in chunks]
            drafted = torch.cat(slot1)
            labels = item.ids[item.anchors + 1]
            suite = sample.id.split("/")[0] if bench_run else "corpus"
            for hinted in (True, False):
                rows = (hints != NO_HINT) == hinted
                count = counts.setdefault((suite, hinted), [0, 0, 0])
                count[0] += int(rows.sum())
                count[1] += int((drafted[rows] == labels[rows]).sum())
                count[2] += int((hints[rows] == labels[rows]).sum())
    print("| suite | positions | with a match | drafter there | hint there | drafter elsewhere |")
    print("|---|--:|--:|--:|--:|--:|")
    for suite in dict.fromkeys(s for s, _ in counts):
        (n, right, hint_right), (m, right_else, _) = counts[suite, True], counts[suite, False]
        print(
            f"| {suite} | {n + m} | {n / max(n + m, 1):.0%} | {right / max(n, 1):.3f} | "
            f"{hint_right / max(n, 1):.3f} | {right_else / max(m, 1):.3f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
