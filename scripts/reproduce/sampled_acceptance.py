"""How often a drafter's draft is accepted at T = 1, drafting its argmax (what vLLM's DFlash
proposer and ours do) or sampling from its own distribution q and verifying against q (standard
speculative sampling), on the held-out blocks `dcoco heldout` reads.

A deterministic draft x at slot j is accepted with the target's probability p_j(x); a draft
sampled from q_j with probability sum_x min(p_j(x), q_j(x)) (Leviathan et al., 2023). Both are
read off the same teacher-forced blocks: p_j from the target's forward over the held-out reply,
q_j from the drafter's pass, both at T = 1. Past slot 1 the target's p_j is conditioned on the
greedy reply's tokens, not on the sampled drafts: slot 1 is exact, the later slots are an
estimate. Prints the per-slot means and the τ they imply for k drafts (slots independent), and
the ceiling of any deterministic draft: the target's own argmax, accepted with max_x p_j(x).

CORPUS=DIR reads the held-out blocks from another corpus (the target's sampled replies to the
held-out prompts, `dcoco datagen --temperature 1`): the contexts a server at T = 1 drafts in.

A METHOD@CHECKPOINT spec with a head (e.g. dcoco@dcoco-joint-12k) adds the head's picks (`head`),
scored the same way; a bare checkpoint name is its drafter alone. A DCOCO corrector also adds
`chain`: drafts sampled slot by slot from its transition scores, q_{j+1}(b | a) = softmax_b
S[j, a, b] over slot j+1's candidates given the reply's token a at slot j (the drafter's own q
where a is not a candidate; slot 1 from the anchor's scores where the corrector has them).

DRAFT_SCALES=0.85,1.15 adds a row `q/S` for each S: drafts sampled from softmax(logits / S), a
draft temperature of its own (any q keeps the target's law; the question is which is accepted
most often).

Usage: [CORPUS=DIR] [DRAFT_SCALES=S,...]
  .venv/bin/python scripts/reproduce/sampled_acceptance.py [CHECKPOINT] [RECORDS]
  (defaults: dflash 32; the shared corpus of SmolLM2, as `dcoco heldout`)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from dcoco.data.distill import load_corpus, split_heldout
from dcoco.decode.draft_length import expected_tokens
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.models.heads.base import select_draft
from dcoco.models.target.loading import DEFAULT_TARGET, load_target
from dcoco.paths import default_corpus
from dcoco.train.block_pass import AnchorRule, block_chunks, prepare_item
from dcoco.train.target_features import TargetFeatures


def main(checkpoint: str, records: int) -> None:
    torch.manual_seed(0)
    target = load_target(DEFAULT_TARGET, "fp32")
    spec = checkpoint if "@" in checkpoint else f"dflash@{checkpoint}"
    proposer = build_proposer(spec, target, MethodOptions())
    drafter, head = proposer.drafter, getattr(proposer, "head", None)
    features = TargetFeatures(target, drafter.config.target_layer_ids, "")
    corpus = Path(os.environ.get("CORPUS") or default_corpus(DEFAULT_TARGET))
    _, heldout = split_heldout(load_corpus(corpus), records)
    block, generator = drafter.config.block_size, torch.Generator().manual_seed(0)
    argmax_rates, sampled_rates, ceiling_rates, head_rates = [], [], [], []  # [blocks, slots]
    chain_rates, scales = [], [float(x) for x in os.environ.get("DRAFT_SCALES", "").split(",") if x]
    scaled_rates = {scale: [] for scale in scales}  # q = softmax(logits / scale), T = 1
    with torch.no_grad():
        for sample in heldout:
            if len(sample.response_ids) < block:
                continue
            item = prepare_item(sample, features, AnchorRule(64), block, generator, 0, "cpu")
            logits = target.forward(item.ids[None], target.new_cache()).logits[0]  # [tokens, V]
            for chunk, anchors in zip(
                block_chunks(drafter, item, 32), item.anchors.split(32), strict=True
            ):
                draft_logits = drafter.logits(chunk.hidden, chunk.hint_ids).float()
                draft = draft_logits.softmax(-1)
                slots = torch.arange(draft.shape[1])
                # p_j: the target's next-token distribution at anchor + j - 1, j = 1..slots
                p = logits[anchors[:, None] + slots[None]].float().softmax(-1)  # [n, slots, V]
                top = draft.argmax(-1, keepdim=True)
                argmax_rates.append(p.gather(-1, top).squeeze(-1))
                sampled_rates.append(torch.minimum(p, draft).sum(-1))
                for scale, rates in scaled_rates.items():
                    q = (draft_logits / scale).softmax(-1)
                    rates.append(torch.minimum(p, q).sum(-1))
                ceiling_rates.append(p.amax(-1))
                if head is not None:  # the head's pick (the corrector reads the anchor too)
                    picks = select_draft(
                        head, chunk.hidden, draft_logits, chunk.anchor_ids, proposer.selection
                    )
                    head_rates.append(p.gather(-1, picks[..., None]).squeeze(-1))
                if head is not None and head.kind == "dcoco":
                    q = chain_probs(head, chunk, draft_logits, draft)
                    chain_rates.append(torch.minimum(p, q).sum(-1))
    rows = [("argmax", argmax_rates), ("sampled", sampled_rates), ("ceiling", ceiling_rates)]
    rows += [("head", head_rates)] if head_rates else []
    rows += [(f"q/{scale:g}", rates) for scale, rates in scaled_rates.items()]
    for name, rates in rows + ([("chain", chain_rates)] if chain_rates else []):
        per_slot = torch.cat(rates).mean(0).tolist()
        taus = [expected_tokens(per_slot, k) for k in (1, 2, 3, 7)]
        cells = " ".join(f"{a:.3f}" for a in per_slot)
        print(f"{checkpoint} {name:8s} slot acceptance {cells} | tau k=1,2,3,7: "
              + " ".join(f"{t:.2f}" for t in taus))  # fmt: skip
    blocks = torch.cat(argmax_rates).shape[0]
    print(f"({blocks} blocks, {len(heldout)} records of {corpus.name}, T = 1)")


def chain_probs(head, chunk, draft_logits, draft):
    """q_j [n, slots, V] of drafts sampled along the corrector's transitions, each slot given the
    reply's token at the slot before (teacher-forced, as p_j is)."""
    scores = head(chunk.hidden, draft_logits.to(chunk.hidden.dtype), chunk.anchor_ids)
    ids = scores.candidate_ids  # [n, slots, K]
    q = draft.clone()  # the drafter's own q where the chain has no row
    if scores.start is not None:
        q[:, 0] = torch.zeros_like(q[:, 0]).scatter(-1, ids[:, 0], scores.start.float().softmax(-1))
    for slot in range(1, ids.shape[1]):
        previous = chunk.label_ids[:, slot - 1]  # [n]
        hit = ids[:, slot - 1] == previous[:, None]  # [n, K]
        rows = hit.any(-1).nonzero().flatten()
        if rows.numel() == 0:
            continue
        a = hit[rows].float().argmax(-1)  # the candidate index of the reply's token
        row_scores = scores.transitions[rows, slot - 1, a].float()  # [rows, K]
        q[rows, slot] = torch.zeros_like(q[rows, slot]).scatter(
            -1, ids[rows, slot], row_scores.softmax(-1)
        )
    return q


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(arguments[0] if arguments else "dflash", int(arguments[1]) if len(arguments) > 1 else 32)
