"""One training pass of the drafter over a sequence's blocks, and the losses read from it.

A sequence's target taps are computed once; its sampled blocks then run through the drafter in
chunks (the block-diagonal attention grows with the square of the blocks per forward). The
drafter's loss is the decayed same-position cross-entropy; a draft head (dcoco.models.heads.base),
if
any, reads the same hidden states and logits.

The loss may run over a shortlist of the vocabulary (`LossVocab`): on a CPU the 49k-row head is
most of a step, and a corpus of the target's own replies uses far fewer distinct tokens. A label
outside the shortlist carries no loss. Decoding and evaluation always use the full head.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dcoco.data.distill import Sample
from dcoco.models.drafter.copy_hints import hints_at, match_table
from dcoco.models.drafter.draft_vocab import rank_tokens
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.heads.base import HeadBatch
from dcoco.train.blocks import (
    IGNORE,
    block_attention_mask,
    block_inputs_and_labels,
    sample_anchors,
    strided_anchors,
)


class LossVocab:
    """The logit columns the loss runs over: token ids `vocab_ids` [vocab'], or all (None)."""

    def __init__(self, drafter: BlockDrafter, vocab_ids: Tensor | None):
        head = drafter._shared[1]
        self.vocab_ids = vocab_ids
        if vocab_ids is None:
            self.weight, self.bias, self.column = head.weight, head.bias, None
            return
        # The head is frozen, so its shortlisted rows are sliced once.
        self.weight = head.weight[vocab_ids].detach()
        self.bias = None if head.bias is None else head.bias[vocab_ids].detach()
        column = torch.full((head.weight.shape[0],), IGNORE, dtype=torch.long)
        column[vocab_ids.cpu()] = torch.arange(vocab_ids.numel())
        self.column = column.to(vocab_ids.device)

    @classmethod
    def most_frequent(cls, drafter: BlockDrafter, samples: list[Sample], size: int) -> LossVocab:
        """The `size` most frequent response tokens of `samples` (0 or more than the vocab: all)."""
        vocab = drafter.config.vocab_size
        if size <= 0 or size >= vocab:
            return cls(drafter, None)
        # the draft vocabulary's order (dcoco.models.drafter.draft_vocab), so the two always agree
        ranked, _ = rank_tokens([s.response_ids for s in samples])
        device = drafter._shared[1].weight.device
        return cls(drafter, ranked[:size].sort().values.to(device))

    def logits(self, hidden: Tensor) -> Tensor:
        """[..., hidden] -> fp32 logits [..., vocab']."""
        return F.linear(hidden.to(self.weight.dtype), self.weight, self.bias).float()

    def label_index(self, label_ids: Tensor) -> Tensor:
        """Token ids -> logit columns; IGNORE where the token is outside the shortlist."""
        if self.column is None:
            return label_ids
        # IGNORE (-100) would index from the end of `column`; keep it IGNORE instead.
        return self.column[label_ids.clamp(min=0)].masked_fill(label_ids < 0, IGNORE)

    def token_ids(self, columns: Tensor) -> Tensor:
        return columns if self.vocab_ids is None else self.vocab_ids[columns]


@dataclass
class Item:
    """One sequence ready for the drafter."""

    ids: Tensor  # [tokens] int64
    features: Tensor  # [1, tokens, taps * hidden]
    anchors: Tensor  # [n] int64, sorted


@dataclass(frozen=True)
class AnchorRule:
    """Which blocks of a sequence a pass trains on: `per_seq` random anchors, or with `stride`
    > 0 every stride-th reply position, shifted by one each epoch (dense anchors). `shift` (the
    run's seed) moves the first epoch's offset, so a later stage run with another seed starts on
    the positions its init's epochs did not use."""

    per_seq: int
    stride: int = 0
    shift: int = 0

    def anchors(self, sample: Sample, block_size: int, epoch: int, generator) -> Tensor:
        loss_mask = torch.zeros(sample.num_tokens, dtype=torch.bool)
        loss_mask[len(sample.prompt_ids) :] = True
        if self.stride <= 0:
            return sample_anchors(loss_mask, self.per_seq, block_size, generator)
        # A per-record phase, so one epoch's blocks do not all sit at the same reply offsets.
        phase = int(hashlib.sha1(sample.id.encode()).hexdigest()[:8], 16)
        return strided_anchors(
            loss_mask, self.stride, (phase + self.shift + epoch) % self.stride, block_size
        )


def prepare_item(
    sample: Sample, features, rule: AnchorRule, block_size: int, generator, epoch: int, device
) -> Item:
    """Target taps of `sample` (via `features`, a TargetFeatures or FeatureCache) and its
    anchors under `rule`."""
    ids = torch.tensor(sample.input_ids, device=device)
    anchors = rule.anchors(sample, block_size, epoch, generator).to(device)
    return Item(ids=ids, features=features(sample), anchors=anchors)


@dataclass
class BlockChunk:
    hidden: Tensor  # [blocks, slots, hidden]: the drafter's final hidden states at the slots
    anchor_ids: Tensor  # [blocks]
    label_ids: Tensor  # [blocks, slots]: same-position labels (blocks are full: none ignored)
    hint_ids: Tensor | None = None  # [blocks, slots]: copy hints (NO_HINT) if the drafter reads any


def block_chunks(
    drafter: BlockDrafter, item: Item, chunk: int, window: int = 0
) -> Iterator[BlockChunk]:
    """The drafter's pass over `item`'s blocks, `chunk` blocks per forward; `window` > 0 shows
    each block only its last `window` context positions (a training curriculum)."""
    return record_chunks(drafter, [item], chunk, window)


def record_chunks(
    drafter: BlockDrafter, items: list[Item], chunk: int, window: int = 0
) -> Iterator[BlockChunk]:
    """The drafter's pass over the blocks of several records side by side: forward j takes the
    j-th `chunk` anchors of every record that has them, one batch row per record, the shorter
    contexts padded and masked, so one forward does the work of len(items). Each yielded chunk
    holds those records' blocks, record by record (a batch keeps a GPU busy; one record is the
    single-record pass exactly)."""
    block_size = drafter.config.block_size
    hints = [
        copy_hints_of(item, block_size) if drafter.config.copy_hints else None for item in items
    ]  # [n_r, block - 1] each
    batch = _PaddedRecords(items)
    for start in range(0, max((item.anchors.numel() for item in items), default=0), chunk):
        rows = [r for r, item in enumerate(items) if item.anchors.numel() > start]
        anchors, valid = _padded([items[r].anchors[start : start + chunk] for r in rows])
        chunk_hints = None
        if drafter.config.copy_hints:
            chunk_hints, _ = _padded([hints[r][start : start + chunk] for r in rows])
        ids, features, context_valid = batch.rows(rows)
        block_ids, positions, labels = block_inputs_and_labels(
            ids, anchors, block_size, drafter.config.mask_token_id, chunk_hints
        )
        mask = block_attention_mask(anchors, ids.shape[1], block_size, context_valid, window)
        context_positions = torch.arange(ids.shape[1], device=ids.device).expand(len(rows), -1)
        hidden = drafter(drafter.embed(block_ids), features, context_positions, positions, mask)
        shape = (*anchors.shape, block_size)  # [records, n, block]
        yield BlockChunk(
            hidden=hidden.view(*shape, -1)[valid][:, 1:],
            anchor_ids=block_ids.view(shape)[valid][:, 0],
            label_ids=labels.view(shape)[valid][:, 1:],
            hint_ids=None if chunk_hints is None else chunk_hints[valid],
        )


class _PaddedRecords:
    """Records' ids [records, tokens] and taps [records, tokens, taps * hidden], padded to the
    longest (built once per batch); one record is its own tensors, unpadded."""

    def __init__(self, items: list[Item]):
        self.lengths = [item.ids.numel() for item in items]
        self.single = items[0] if len(items) == 1 else None
        if self.single is not None or not items:
            return
        first, longest = items[0], max(self.lengths)
        self.ids = torch.zeros(len(items), longest, dtype=torch.long, device=first.ids.device)
        self.features = first.features.new_zeros(len(items), longest, first.features.shape[-1])
        for r, item in enumerate(items):
            self.ids[r, : self.lengths[r]] = item.ids
            self.features[r, : self.lengths[r]] = item.features[0]

    def rows(self, rows: list[int]) -> tuple[Tensor, Tensor, Tensor | None]:
        """(ids, taps, context_valid or None where no row is padded) of the records `rows`."""
        if self.single is not None:
            return self.single.ids[None], self.single.features, None
        longest = max(self.lengths[r] for r in rows)
        lengths = torch.tensor([self.lengths[r] for r in rows], device=self.ids.device)
        valid = torch.arange(longest, device=self.ids.device)[None] < lengths[:, None]
        padded = None if bool(valid.all()) else valid
        return self.ids[rows, :longest], self.features[rows, :longest], padded


def _padded(parts: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Rows [n_r, ...] -> [records, n, ...] (each padded with its own last row) and the real
    rows' mask [records, n]."""
    n = max(part.shape[0] for part in parts)
    padded = [torch.cat([p, p[-1:].expand(n - p.shape[0], *p.shape[1:])]) for p in parts]
    valid = (
        torch.arange(n, device=parts[0].device)[None]
        < torch.tensor([part.shape[0] for part in parts], device=parts[0].device)[:, None]
    )
    return torch.stack(padded), valid


def copy_hints_of(item: Item, block_size: int) -> Tensor:
    """[n, block - 1] copy hints of `item`'s blocks, from the tokens up to each anchor."""
    ids = item.ids.tolist()
    follow = match_table(ids)
    rows = [hints_at(ids, follow, a, block_size - 1) for a in item.anchors.tolist()]
    return torch.tensor(rows, dtype=torch.long, device=item.ids.device).view(-1, block_size - 1)


@dataclass
class ChunkLosses:
    drafter_loss: Tensor  # scalar: sum of w * CE over the chunk's slots
    drafter_correct: Tensor  # [blocks, slots] bool: drafter argmax == label
    head_loss: Tensor | None  # scalar: the head's sum of w * loss
    head_correct: Tensor | None  # [blocks, slots] bool: the head's teacher-forced draft == label


def chunk_losses(
    drafter: BlockDrafter,
    head,
    chunk: BlockChunk,
    loss_vocab: LossVocab,
    slot_weights: Tensor,  # [slots]: exp(-(k-1)/gamma) for slots k = 1 .. block - 1
    progress: float,
    train_drafter: bool,
) -> ChunkLosses:
    """The drafter's (and the head's) losses on one chunk. With `train_drafter` False the
    drafter's outputs carry no gradient (a frozen drafter under a drop-in head)."""
    hidden = chunk.hidden if train_drafter else chunk.hidden.detach()
    with torch.set_grad_enabled(train_drafter and torch.is_grad_enabled()):
        logits = loss_vocab.logits(hidden)  # [blocks, slots, vocab']
        if chunk.hint_ids is not None:
            hint_columns = loss_vocab.label_index(chunk.hint_ids)
            logits = drafter.copy_logits(logits, hidden, hint_columns)
        label_index = loss_vocab.label_index(chunk.label_ids)  # [blocks, slots]
        ce = F.cross_entropy(
            logits.flatten(0, 1), label_index.flatten(), ignore_index=IGNORE, reduction="none"
        ).view_as(label_index)
        drafter_loss = (ce * slot_weights).sum()
    drafter_correct = loss_vocab.token_ids(logits.argmax(dim=-1)) == chunk.label_ids
    if head is None:
        return ChunkLosses(drafter_loss, drafter_correct, None, None)
    batch = HeadBatch(
        hidden=hidden,
        logits=logits,
        vocab_ids=loss_vocab.vocab_ids,
        anchor_ids=chunk.anchor_ids,
        label_ids=chunk.label_ids,
        label_index=label_index,
        slot_weights=slot_weights,
        progress=progress,
    )
    head_out = head.training_loss(batch)
    return ChunkLosses(drafter_loss, drafter_correct, head_out.weighted_loss, head_out.correct)
