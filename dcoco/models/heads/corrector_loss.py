"""The corrector's training losses, and the walk's teacher-forced correctness they report.

Two losses (`CorrectorConfig.loss`), each over the transition scores S of
dcoco.models.heads.corrector:

- `pairs` (the paper's): one softmax over all K x K transitions of each adjacent slot pair,
  labelled with the target's own token pair; a pair whose labels are not both among the
  candidates is masked. It factors as -log P(a*) - log P(b* | a*), logged apart as `which_a` and
  `b_given_a`: the first term can fall while the walk, which reads only argmax_b S[p, a, b],
  learns nothing.
- `conditional` (the published selectors'): a K-way cross-entropy per row S[p, a*, :], a* being
  the target's token at slot p (teacher forcing), so every gradient goes to "which successor,
  given the right predecessor", exactly what the walk reads. A term of S that depends only on a
  cancels in it. Where the target's token at slot p + 1 is not among the candidates it is written
  into the last candidate with its real logit (else the hard rows have no positive class); rows
  are supervised inside the reachable prefix only (the target's token among the candidates at
  every slot up to p). With `anchor`, the start row (anchor -> slot 0) is one more row.

Row p weighs exp(-(p + 1) / gamma), the weight of the slot it picks (`slot_weights`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dcoco.contracts import IGNORE
from dcoco.models.heads.base import Candidates, HeadBatch, HeadLoss

LOSSES = ("pairs", "conditional")


def batch_candidates(batch: HeadBatch, top_k: int) -> Candidates:
    """The batch's top-K candidates: precomputed (full vocabulary), or from its loss-vocabulary
    logits (a label outside the shortlist gets a logit below every candidate)."""
    if batch.candidates is not None:
        given = batch.candidates
        return Candidates(
            given.ids[..., :top_k].long(), given.logits[..., :top_k].float(),
            given.logsumexp.float(), given.label_logits.float(),
        )  # fmt: skip
    logits = batch.logits.float()  # [blocks, slots, vocab']
    values, columns = logits.topk(top_k, dim=-1)
    ids = columns if batch.vocab_ids is None else batch.vocab_ids[columns]
    floor = logits.amin(dim=-1) - 1.0  # [blocks, slots]
    index = batch.label_index.clamp(min=0)[..., None]
    label_logits = torch.where(
        batch.label_index == IGNORE, floor, logits.gather(-1, index).squeeze(-1)
    )
    return Candidates(ids, values, logits.logsumexp(dim=-1), label_logits)


def with_labels_inserted(candidates: Candidates, labels: Tensor) -> tuple[Candidates, Tensor]:
    """(candidates whose last entry is the label wherever the label is missing, with its real
    logit; the label's candidate index [blocks, slots])."""
    hit = candidates.ids == labels[..., None]  # [blocks, slots, K]
    present = hit.any(dim=-1)
    last = candidates.ids.shape[-1] - 1
    ids, logits = candidates.ids.clone(), candidates.logits.clone()
    ids[..., last] = torch.where(present, ids[..., last], labels)
    logits[..., last] = torch.where(present, logits[..., last], candidates.label_logits)
    where = torch.where(present, hit.long().argmax(dim=-1), last)
    return Candidates(ids, logits, candidates.logsumexp, candidates.label_logits), where


def corrector_training_loss(corrector, batch: HeadBatch) -> HeadLoss:
    config = corrector.config
    natural = batch_candidates(batch, config.top_k)
    labels = batch.label_ids
    hit = natural.ids == labels[..., None]
    present = hit.any(dim=-1)  # [blocks, slots]
    if config.loss == "conditional":
        candidates, where = with_labels_inserted(natural, labels)
    else:
        candidates, where = natural, hit.long().argmax(dim=-1)
    scores = corrector.score(
        batch.hidden, candidates.logits, candidates.ids, candidates.logsumexp, batch.anchor_ids
    )
    top_k = config.top_k
    # [blocks, slots - 1, K]: S[p, a*_p, :], the walk's row once it chose the label at p
    rows = scores.transitions.gather(2, where[:, :-1, None, None].expand(-1, -1, 1, top_k)).squeeze(
        2
    )
    weights = batch.slot_weights.to(torch.float32)  # [slots]
    if config.loss == "conditional":
        weighted, parts = _conditional(scores, rows, where, present, weights)
    else:
        weighted, parts = _pairs(scores, where, present, weights, top_k)
    first = (
        natural.ids[:, 0, 0] == labels[:, 0]
        if scores.start is None
        else present[:, 0] & (scores.start.argmax(dim=-1) == where[:, 0])
    )
    later = present[:, 1:] & (rows.argmax(dim=-1) == where[:, 1:])
    correct = torch.cat([first[:, None], later], dim=1)
    return HeadLoss(weighted_loss=weighted, correct=correct, parts=parts)


def _conditional(scores, rows, where, present, weights):
    reach = present.long().cumprod(dim=1).bool()  # [blocks, slots]: labels among candidates
    ce = F.cross_entropy(rows.flatten(0, 1), where[:, 1:].flatten(), reduction="none").view_as(
        rows[..., 0]
    )  # [blocks, slots - 1]
    rows_loss = (ce * weights[1:] * reach[:, :-1]).sum()
    parts = {"conditional": rows_loss.detach()}
    total = rows_loss
    if scores.start is not None:
        start = F.cross_entropy(scores.start, where[:, 0], reduction="none")  # [blocks]
        start_loss = (start * weights[0]).sum()
        parts["start"] = start_loss.detach()
        total = total + start_loss
    return total, parts


def _pairs(scores, where, present, weights, top_k):
    transitions = scores.transitions  # [blocks, slots - 1, K, K]
    valid = present[:, :-1] & present[:, 1:]  # [blocks, slots - 1]
    pair_target = where[:, :-1] * top_k + where[:, 1:]
    ce = F.cross_entropy(
        transitions.flatten(2).flatten(0, 1), pair_target.flatten(), reduction="none"
    ).view_as(valid)
    # -log P(a*, b*) = -log P(a*) - log P(b* | a*): P(a) = softmax_a(logsumexp_b S[p, a, b])
    row_mass = transitions.logsumexp(dim=-1)  # [blocks, slots - 1, K]
    which_a = F.cross_entropy(
        row_mass.flatten(0, 1), where[:, :-1].flatten(), reduction="none"
    ).view_as(valid)
    pair_weights = weights[:-1] * valid  # a pair weighs like its first slot
    total = (ce * pair_weights).sum()
    parts = {
        "which_a": (which_a * pair_weights).sum().detach(),
        "b_given_a": ((ce - which_a) * pair_weights).sum().detach(),
    }
    if scores.start is not None:
        start = F.cross_entropy(scores.start, where[:, 0], reduction="none")
        start_loss = (start * weights[0] * present[:, 0]).sum()
        parts["start"] = start_loss.detach()
        total = total + start_loss
    return total, parts
