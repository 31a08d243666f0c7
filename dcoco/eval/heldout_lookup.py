"""Prompt lookup on `dcoco heldout`'s blocks: what `pld` would draft after each held-out anchor.

Lookup needs no target features, only the tokens up to the anchor, so its row costs no target
forward. The anchors are drawn exactly as for a drafter of the same block size (same generator,
same order), so its blocks are the drafters' blocks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.decode.proposers import DraftContext, PromptLookupProposer
from dcoco.train.block_pass import AnchorRule


def lookup_corrects(
    samples, block_size: int, anchors_per_seq: int, by_suite: bool
) -> dict[str, list[Tensor]]:
    """suite ("" unless `by_suite`) -> [[blocks, slots] bool]: pld's draft == the reply, per slot
    (a slot lookup leaves empty counts as a miss)."""
    slots = block_size - 1
    proposer = PromptLookupProposer(num_draft_tokens=slots)
    generator = torch.Generator().manual_seed(0)  # as dcoco.eval.heldout._accept draws them
    rule = AnchorRule(anchors_per_seq)
    corrects: dict[str, list[Tensor]] = {}
    for sample in samples:
        if len(sample.response_ids) < block_size:
            continue
        ids = torch.tensor(sample.input_ids)
        anchors = rule.anchors(sample, block_size, 0, generator).tolist()
        rows = []
        for anchor in anchors:
            draft = proposer.propose(DraftContext(ids[: anchor + 1], None, slots)).draft_tokens[0]
            labels = ids[anchor + 1 : anchor + block_size]
            row = torch.zeros(slots, dtype=torch.bool)
            row[: draft.numel()] = draft == labels[: draft.numel()]
            rows.append(row)
        if rows:
            suite = sample.id.split("/")[0] if by_suite else ""
            corrects.setdefault(suite, []).append(torch.stack(rows))
    return corrects
