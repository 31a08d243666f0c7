"""The corrector's candidates (the drafter's top-k per slot) and what its delta reads of each
besides its representation z.

`logit`: the drafter's logit L alone. `normalised`: L, then log p, p, L - L_top1, rank / K,
is-top-1 and is-anchor, as published candidate selectors feed them (not raw logits alone). The
rank is over the corrector's trained top-k, so a walk over fewer candidates (`RULE/K`) gives them
the feature values the corrector was trained on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.models.cpu.row_reduce import row_topk

FEATURES = ("logit", "normalised")
FEATURE_WIDTH = {"logit": 1, "normalised": 7}
# Slots per chunk of the vocabulary-wide reductions: each full-size fp32 temporary of a large
# batch (44 MB at 32 requests x 7 slots) is fresh memory, whose page faults cost more than the
# reduction (measured 2-2.6x slower than 32-slot chunks at 112-224 slots on an AVX2 Zen 3).
CHUNK_SLOTS = 32


def top_candidates(
    logits: Tensor, top_k: int, normaliser: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The top_k candidates' fp32 logits and ids [batch, slots, K], sorted (index 0 is the
    drafter's argmax), and each slot's log normaliser [batch, slots] (None unless `normaliser`)
    from logits [batch, slots, vocab]; per chunk of slots, with the same bits as in one piece."""
    rows = logits.reshape(-1, logits.shape[-1])
    # Compiled (dcoco.models.heads.head_compile), one piece: a loop over a symbolic row count would
    # compile a graph per row count, and inductor plans its own temporaries.
    compiling = torch.compiler.is_compiling()
    step = rows.shape[0] if compiling else CHUNK_SLOTS
    values, ids, normalisers = [], [], []
    for start in (0,) if compiling else range(0, rows.shape[0], step):
        chunk = rows[start : start + step].float()
        top_values, top_ids = row_topk(chunk, top_k)
        values.append(top_values)
        ids.append(top_ids)
        if normaliser:
            normalisers.append(chunk.logsumexp(dim=-1))
    shape = logits.shape[:-1]
    return (
        torch.cat(values).view(*shape, top_k),
        torch.cat(ids).view(*shape, top_k),
        torch.cat(normalisers).view(shape) if normaliser else None,
    )


def candidate_features(
    logits: Tensor, logsumexp: Tensor | None, kind: str, trained_top_k: int
) -> Tensor:
    """f [batch, slots, K, features] from candidate logits [batch, slots, K] (sorted) and the
    slots' log normalisers [batch, slots] (None: from the candidates alone)."""
    if kind == "logit":
        return logits[..., None]
    if logsumexp is None:
        logsumexp = logits.logsumexp(dim=-1)
    log_probs = logits - logsumexp[..., None]
    top_k = logits.shape[-1]
    rank = torch.arange(top_k, device=logits.device, dtype=logits.dtype) / trained_top_k
    columns = [
        logits,
        log_probs,
        log_probs.exp(),
        logits - logits[..., :1],
        rank.expand_as(logits),
        (rank == 0).to(logits.dtype).expand_as(logits),
        torch.zeros_like(logits),  # is-anchor
    ]
    return torch.stack(columns, dim=-1)


def anchor_features(features: Tensor, kind: str) -> Tensor:
    """[batch, 1, K, features]: the anchor as a certain top-1 (normalised: log p = gap = rank =
    0; p, is-top-1 and is-anchor = 1)."""
    anchor = torch.zeros_like(features[:, :1])
    if kind == "normalised":
        anchor[..., 2] = 1.0
        anchor[..., 5:] = 1.0
    return anchor


def with_anchor_slot(
    hidden: Tensor, candidate_ids: Tensor, features: Tensor, anchor_ids: Tensor, kind: str
) -> tuple[Tensor, Tensor, Tensor]:
    """hidden [batch, slots, hidden], ids and features [batch, slots, K, *] with the anchor
    `anchor_ids` [batch] as a virtual slot before slot 0: slot 0's hidden state, the anchor token
    as every candidate, features of a certain top-1 (one more slot each)."""
    ids = anchor_ids.view(-1, 1, 1).expand(-1, 1, candidate_ids.shape[-1])
    return (
        torch.cat([hidden[:, :1], hidden], dim=1),
        torch.cat([ids.to(candidate_ids.dtype), candidate_ids], dim=1),
        torch.cat([anchor_features(features, kind), features], dim=1),
    )
