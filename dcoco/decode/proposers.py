"""Proposers: what drafts a block for the engine to verify.

A proposer is per-request state: `start()` resets it for a prompt, then each cycle `propose()` gets
the committed tokens (the anchor last) and the target features of the tokens committed since its
previous call, and returns a Proposal of at most `max_slots` draft tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dcoco.contracts import Proposal, SamplingParams
from dcoco.models.drafter.copy_hints import NO_HINT, last_match


@dataclass
class DraftContext:
    tokens: Tensor  # [tokens] int64: prompt + everything committed; the last one is the anchor
    # [batch, new, taps * hidden]: target taps of the committed tokens the proposer has not seen
    # yet (positions before the anchor), or None when the proposer needs no features.
    new_features: Tensor | None
    max_slots: int
    # The request's sampling and generator: a drafter may sample its drafts (greedy or None: it
    # drafts its argmax).
    sampling: SamplingParams | None = None
    generator: torch.Generator | None = None

    @property
    def sampled(self) -> bool:
        return self.sampling is not None and not self.sampling.greedy


class Proposer(Protocol):
    name: str
    feature_layers: tuple[int, ...]  # target taps the proposer reads; () for none
    num_draft_tokens: int  # the most drafts per cycle
    acceptance_prior: tuple[float, ...]  # per-slot acceptance to start from; () = unknown

    def start(self, prompt_ids: list[int]) -> None: ...

    def propose(self, context: DraftContext) -> Proposal: ...


def empty_proposal(device: torch.device | str = "cpu") -> Proposal:
    return Proposal(draft_tokens=torch.zeros(1, 0, dtype=torch.long, device=device))


class PromptLookupProposer:
    """Prompt-lookup (n-gram) drafting: the model-free baseline.

    Find the most recent earlier occurrence of the last n tokens (n from `max_ngram` down to
    `min_ngram`) and propose the tokens that followed it. Code, quotes and lists repeat their
    context, so this alone often accepts several tokens per cycle.
    """

    name = "pld"
    feature_layers: tuple[int, ...] = ()
    acceptance_prior: tuple[float, ...] = ()  # depends on the text: learnt while decoding

    def __init__(self, num_draft_tokens: int = 8, max_ngram: int = 3, min_ngram: int = 1):
        if num_draft_tokens < 1 or not 1 <= min_ngram <= max_ngram:
            raise ValueError("need num_draft_tokens >= 1 and 1 <= min_ngram <= max_ngram")
        self.num_draft_tokens = num_draft_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def start(self, prompt_ids: list[int]) -> None:
        """Stateless: the lookup reads the whole context every cycle."""

    def propose(self, context: DraftContext) -> Proposal:
        tokens = context.tokens  # [tokens]
        limit = min(self.num_draft_tokens, context.max_slots)
        draft = self._lookup(tokens, limit) if limit > 0 else tokens[:0]
        return Proposal(draft_tokens=draft[None])

    def _lookup(self, tokens: Tensor, limit: int) -> Tensor:
        follow = last_match(tokens, self.max_ngram, self.min_ngram)
        return tokens[:0] if follow == NO_HINT else tokens[follow : follow + limit]
