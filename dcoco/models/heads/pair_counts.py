"""Counted successor statistics a corrector can read: log P(b | a) of adjacent reply tokens.

A corrector that must learn from a few hundred thousand blocks which token follows which cannot
learn the pair statistics of a 49k-token vocabulary on its own; the corpus it trains on has
counted them already. `PairCounts` keeps the smoothed log-probabilities of every pair seen in the
training replies (dcoco.data.bigram.successor_log_probs) as buffers, so they ship inside the
checkpoint, and looks up a K x K grid of them per slot pair. Its size (`pairs`) is part of the
corrector's config, so a loader allocates the buffers before reading them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PairCounts(nn.Module):
    def __init__(self, pairs: int, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.register_buffer("codes", torch.zeros(pairs, dtype=torch.long))  # a * vocab + b, sorted
        self.register_buffer("log_probs", torch.zeros(pairs))  # log P(b | a) of each code
        self.register_buffer("unseen", torch.zeros(vocab_size))  # log P(b | a) unseen, per a

    def fill(self, codes: Tensor, log_probs: Tensor, unseen: Tensor) -> None:
        with torch.no_grad():
            self.codes.copy_(codes)
            self.log_probs.copy_(log_probs)
            self.unseen.copy_(unseen)

    def forward(self, first: Tensor, second: Tensor) -> Tensor:
        """log P(b | a) [..., K_a, K_b] for token ids first [..., K_a] and second [..., K_b]."""
        codes = first[..., :, None] * self.vocab_size + second[..., None, :]
        if self.codes.numel() == 0:
            return self.unseen[first][..., None].expand_as(codes).float()
        index = torch.searchsorted(self.codes, codes).clamp(max=self.codes.numel() - 1)
        seen = self.codes[index] == codes
        return torch.where(seen, self.log_probs[index], self.unseen[first][..., None]).float()
