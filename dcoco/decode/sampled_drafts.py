"""Drafts sampled from the drafter's own distribution, for sampled requests (T > 0).

A deterministic draft x at slot j is accepted with the target's probability p_j(x); a draft drawn
from the drafter's q_j, verified against q_j (standard speculative sampling, dcoco.decode.verify),
with sum_x min(p_j(x), q_j(x)), which is larger wherever the target spreads its mass. On the
held-out prompts answered by SmolLM2 at T = 1, slot 1 of the shipped `dflash`: 0.262 drafting the
argmax, 0.355 sampling (scripts/reproduce/sampled_acceptance.py, results/smollm2-t1-drafters).

q is the drafter's logits under the request's own temperature, top-k and top-p; any q keeps the
target's distribution, the closer to p the more drafts land.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.contracts import Proposal, SamplingParams
from dcoco.decode.sampling import logits_to_probs, sample
from dcoco.models.drafter.draft_vocab import full_vocab_probs


def sampled_proposal(
    logits: Tensor,  # [batch, slots, columns]: the full vocabulary, or the draft vocabulary's
    columns: Tensor | None,  # [columns] token ids of the logits' columns; None: every token
    vocab_size: int,
    sampling: SamplingParams,
    generator: torch.Generator | None,
) -> Proposal:
    """One draw per slot from q = the drafter's filtered distribution, with q over the whole
    vocabulary (zero outside the draft vocabulary) for the verifier."""
    probs = logits_to_probs(logits, sampling)  # [batch, slots, columns]
    drawn = sample(probs, generator)  # [batch, slots] column indices
    if columns is None:
        return Proposal(draft_tokens=drawn, draft_probs=probs)
    draft_probs = full_vocab_probs(probs, columns, vocab_size)  # [batch, slots, vocab]
    return Proposal(draft_tokens=columns[drawn], draft_probs=draft_probs)
