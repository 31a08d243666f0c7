"""Draft heads: small modules trained on top of a block drafter that turn its one pass into a draft.

- `dcoco`: the parallel corrector (dcoco.models.heads.corrector): top-K transition scores for all
  slot pairs in one batched op, then a selection rule walks them.
- `dspark`: a DSpark-style Markov head: a low-rank logit bias from the previous token, applied slot
  by slot (dcoco.models.heads.sequential_heads).
- `domino`: a Domino-style GRU head: a full-vocabulary logit delta from a GRU over the tokens
  drafted so far, slot by slot (dcoco.models.heads.sequential_heads).

Every head has a zero-initialised output, so an untrained head drafts exactly the drafter's argmax.
All heads share one training contract (`HeadBatch` in, `HeadLoss` out) and one decoding contract
(`select`), so one trainer, one checkpoint format and one proposer serve them all. This module is
the contract only; dcoco.models.heads.head_registry maps kind names to the heads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.drafter.draft_vocab import full_vocab_logits


@dataclass
class Candidates:
    """The drafter's top-K per slot, with what normalised candidate features need."""

    ids: Tensor  # [blocks, slots, K] int64 token ids, by logit, descending
    logits: Tensor  # [blocks, slots, K] fp32
    logsumexp: Tensor  # [blocks, slots] fp32: log of the softmax normaliser over the vocabulary
    label_logits: Tensor  # [blocks, slots] fp32: the drafter's logit of the target's token


@dataclass
class HeadBatch:
    """One drafter pass over training blocks, seen from a head. Draft slots only (no anchor)."""

    hidden: Tensor  # [blocks, slots, hidden]: the drafter's final hidden states
    # [blocks, slots, vocab']: the drafter's logits over the loss vocabulary; None when only
    # `candidates` were kept (the corrector cache), which the corrector alone can train from
    logits: Tensor | None
    vocab_ids: Tensor | None  # [vocab'] token id of each logit column; None = the full vocab
    anchor_ids: Tensor  # [blocks] the anchor token of each block
    label_ids: Tensor  # [blocks, slots] the target's tokens (token ids)
    label_index: Tensor  # [blocks, slots] column of the label in `logits`; IGNORE if absent
    slot_weights: Tensor  # [slots] loss weight by depth, exp(-(k-1)/gamma)
    progress: float = 1.0  # fraction of training done, for curricula (0 at the first step)
    candidates: Candidates | None = None  # precomputed full-vocabulary top-K (corrector cache)


@dataclass
class HeadLoss:
    weighted_loss: Tensor  # scalar: sum over blocks and slots of weight * loss
    correct: Tensor  # [blocks, slots] bool: the head's draft, teacher-forced on the labels,
    # equals the label. Up to the first miss a drafted prefix equals the labels, so
    # cumprod(correct).sum() + 1 is exactly the acceptance length the engine would see.
    parts: dict[str, Tensor] | None = None  # named loss terms (sums), logged apart


class DraftHead(Protocol):
    kind: str
    config: object

    def training_loss(self, batch: HeadBatch) -> HeadLoss: ...

    def select(
        self,
        hidden: Tensor,  # [batch, slots, hidden]
        logits: Tensor,  # [batch, slots, vocab]: full-vocabulary drafter logits
        anchor_ids: Tensor,  # [batch]
    ) -> Tensor: ...  # [batch, slots] draft token ids


def select_draft(
    head: DraftHead,
    hidden: Tensor,
    logits: Tensor,
    anchor_ids: Tensor,
    selection: str | None,
    column_ids: Tensor | None = None,
) -> Tensor:
    """`head.select`, passing the corrector's selection rule (dcoco.models.heads.selection) when the
    caller names one. Only the corrector has rules; the sequential heads draft one way.
    `column_ids` [N]: the token id of each logits column (a draft vocabulary): the corrector maps
    its candidates, the sequential heads (which read every token's logit) get -inf elsewhere."""
    if head.kind != "dcoco":
        if selection is not None:
            raise DcocoError(f"a {head.kind} head takes no selection rule (only dcoco does)")
        if column_ids is not None:
            logits = full_vocab_logits(logits, column_ids, head.config.vocab_size)
        return head.select(hidden, logits, anchor_ids)
    if selection is None and column_ids is None:
        return head.select(hidden, logits, anchor_ids)
    rule = {"selection": selection, "column_ids": column_ids}
    return head.select(hidden, logits, anchor_ids, **rule)  # type: ignore[call-arg]


def head_config_dict(head: nn.Module) -> dict:
    return {"kind": head.kind, **dataclasses.asdict(head.config)}
