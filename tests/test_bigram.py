"""The count-bigram baseline: x_t -> x_{t+k} tables counted on the training replies."""

from __future__ import annotations

import torch

from dcoco.data.bigram import CountBigram
from dcoco.data.distill import Sample


def test_bigram_predicts_the_most_frequent_follower_at_each_distance():
    samples = [
        Sample("a", (1,), (5, 6, 7, 5, 6, 8)),  # 5 -> 6 twice; 5 -> +2: 7 and 8
        Sample("b", (1,), (5, 9, 7)),  # 5 -> 9 once, 5 -> +2: 7
        Sample("c", (1,), (4, 4, 4, 4)),
    ]
    bigram = CountBigram(samples, slots=2, vocab_size=10)
    assert bigram.slots == 2
    assert bigram.predict(torch.tensor([5, 4])).tolist() == [[6, 7], [4, 4]]
    # An anchor never seen first in a pair gets the most frequent follower overall.
    assert bigram.predict(torch.tensor([3])).tolist() == [[4, 4]]


def test_bigram_ties_go_to_the_smaller_id():
    bigram = CountBigram([Sample("a", (), (2, 9, 2, 3))], slots=1, vocab_size=10)
    assert bigram.predict(torch.tensor([2])).tolist() == [[3]]
