"""How much a drafter's first slot reads the anchor: the share of held-out blocks whose slot-1
argmax stays the same when the anchor token is replaced by a random one (1.0: the anchor is
ignored; a drafter predicting the token after the anchor from the anchor itself changes it almost
always). On the corpus's greedy held-out replies and, with CORPUS=DIR, on another corpus's (the
target's sampled replies, `dcoco datagen --temperature 1`). The blocks carry no copy hints
(every mask slot reads MASK, as where prompt lookup finds no match), so the anchor swap changes
nothing else: this is dcoco.train.block_pass.block_chunks's pass without its hints.

Usage: [CORPUS=DIR] .venv/bin/python scripts/reproduce/anchor_reliance.py [CHECKPOINT] [RECORDS]
  (defaults: dflash 12: 32 blocks of each of the first 12 held-out replies)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from dcoco.data.distill import load_corpus, split_heldout
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.models.target.loading import DEFAULT_TARGET, load_target
from dcoco.paths import default_corpus
from dcoco.train.block_pass import (
    AnchorRule,
    block_attention_mask,
    block_inputs_and_labels,
    prepare_item,
)
from dcoco.train.target_features import TargetFeatures


def slot1_unchanged(drafter, item, generator) -> tuple[int, int]:
    """(blocks whose slot-1 argmax survives a random anchor, blocks) over `item`'s first 32."""
    block = drafter.config.block_size
    ids = item.ids[None]  # [1, tokens]
    anchors = item.anchors[:32][None]  # [1, n]
    block_ids, positions, _ = block_inputs_and_labels(
        ids, anchors, block, drafter.config.mask_token_id, None
    )
    mask = block_attention_mask(anchors, ids.shape[1], block)
    context = torch.arange(ids.shape[1])[None]
    picks = []
    for swap in (False, True):
        rows = block_ids.clone().view(-1, block)  # [n, block]
        if swap:
            rows[:, 0] = torch.randint(100, 40000, (rows.shape[0],), generator=generator)
        hidden = drafter(drafter.embed(rows.view(1, -1)), item.features, context, positions, mask)
        hidden = hidden.view(rows.shape[0], block, -1)[:, 1:]
        picks.append(drafter.logits(hidden, None)[:, 0].argmax(-1))
    return int((picks[0] == picks[1]).sum()), picks[0].numel()


def main(checkpoint: str, records: int) -> None:
    torch.manual_seed(0)
    target = load_target(DEFAULT_TARGET, "fp32")
    drafter = build_proposer(f"dflash@{checkpoint}", target, MethodOptions()).drafter
    features = TargetFeatures(target, drafter.config.target_layer_ids, "")
    corpora = [default_corpus(DEFAULT_TARGET)] + ([Path(os.environ["CORPUS"])]
                                                  if os.environ.get("CORPUS") else [])  # fmt: skip
    block = drafter.config.block_size
    for corpus in corpora:
        _, heldout = split_heldout(load_corpus(corpus), 32)
        generator = torch.Generator().manual_seed(0)
        same = total = 0
        with torch.no_grad():
            for sample in [s for s in heldout if len(s.response_ids) >= block][:records]:
                item = prepare_item(sample, features, AnchorRule(64), block, generator, 0, "cpu")
                kept, blocks = slot1_unchanged(drafter, item, generator)
                same, total = same + kept, total + blocks
        print(f"{checkpoint} on {corpus.name}: slot-1 argmax unchanged with a random anchor in "
              f"{same}/{total} blocks ({same / total:.3f})")  # fmt: skip


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(arguments[0] if arguments else "dflash", int(arguments[1]) if len(arguments) > 1 else 12)
