"""The count baseline a drafter must beat: from the anchor token alone, the most frequent token
`k` positions later in the training replies (x_t -> x_{t+k}, one table per slot k).

It needs no target and no features, so a drafter below it at some slot has learned less than a
table of counts there.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dcoco.data.distill import Sample
from dcoco.errors import DcocoError


class CountBigram:
    """`predict(anchor_ids [blocks])` -> [blocks, slots] token ids."""

    def __init__(self, samples: list[Sample], slots: int, vocab_size: int):
        self.tables = []  # per slot: [vocab] the follower id at that distance
        replies = [np.asarray(s.response_ids, dtype=np.int64) for s in samples]
        if any(r.size and r.max() >= vocab_size for r in replies):
            raise DcocoError(f"the bigram's records hold token ids beyond the vocab ({vocab_size})")
        for k in range(1, slots + 1):
            pairs = [r[:-k] * vocab_size + r[k:] for r in replies if r.size > k]
            self.tables.append(_most_frequent_follower(np.concatenate(pairs), vocab_size))

    @property
    def slots(self) -> int:
        return len(self.tables)

    def predict(self, anchor_ids: Tensor) -> Tensor:
        anchors = anchor_ids.cpu().numpy()
        rows = np.stack([table[anchors] for table in self.tables], axis=-1)
        return torch.from_numpy(rows).to(anchor_ids.device)


def _most_frequent_follower(codes: np.ndarray, vocab_size: int) -> np.ndarray:
    """For pair codes `first * vocab + second`: per first token, its most frequent second one
    (ties: the smaller id); first tokens never seen get the most frequent second token overall."""
    pairs, counts = np.unique(codes, return_counts=True)
    first, second = pairs // vocab_size, pairs % vocab_size
    overall = np.bincount(second, weights=counts, minlength=vocab_size).argmax()
    table = np.full(vocab_size, overall, dtype=np.int64)
    # Sort by (first, -count, second) and keep each first token's leading row.
    order = np.lexsort((second, -counts, first))
    first, second = first[order], second[order]
    leading = np.ones(first.size, dtype=bool)
    leading[1:] = first[1:] != first[:-1]
    table[first[leading]] = second[leading]
    return table


def successor_log_probs(
    samples: list[Sample], vocab_size: int, alpha: float = 0.01
) -> tuple[Tensor, Tensor, Tensor]:
    """Smoothed log P(b | a) of adjacent reply tokens: (codes [pairs] int64, a * vocab + b of
    every pair seen, sorted; their log-probs [pairs]; the log-prob of an unseen pair [vocab],
    per first token a), with add-`alpha` smoothing over the vocabulary."""
    replies = [np.asarray(s.response_ids, dtype=np.int64) for s in samples]
    codes = [r[:-1] * vocab_size + r[1:] for r in replies if r.size > 1]
    pairs, counts = np.unique(np.concatenate(codes) if codes else np.zeros(0, np.int64),
                              return_counts=True)  # fmt: skip
    totals = np.bincount(pairs // vocab_size, weights=counts, minlength=vocab_size)
    denominator = totals + alpha * vocab_size
    log_probs = np.log((counts + alpha) / denominator[pairs // vocab_size])
    unseen = np.log(alpha / denominator)
    return (
        torch.from_numpy(pairs),
        torch.from_numpy(log_probs).float(),
        torch.from_numpy(unseen).float(),
    )
