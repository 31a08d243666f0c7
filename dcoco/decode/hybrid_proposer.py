"""The hybrid proposer: prompt lookup where the context repeats itself, the drafter elsewhere.

Each cycle looks the n-gram ending at the anchor up among its earlier occurrences (n = 3, then 2:
dcoco.models.drafter.copy_hints, the match the copy-hint drafter reads). With a match it proposes
the tokens that followed it, continued through a loop shorter than the block; without one, the
drafter's block. Lookup's single-token matches are left out: there the drafter is right more often.
On the corpus's held-out blocks such a match exists at 52% of the positions and names the next token
77% of the time there, against 42% for the block-8 drafter, which is right 57% of the time where
there is none (scripts/reproduce/copy_split.py).

The drafter does not run in the cycles lookup answers. The taps it did not read wait for its next
pass, so its context cache stays whole.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from dcoco.contracts import Proposal
from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.proposers import DraftContext
from dcoco.models.drafter.copy_hints import NO_HINT


class HybridProposer:
    name = "pld-dflash"
    lookup = True  # `dcoco heldout` puts the lookup tokens in place of the drafter's where found

    def __init__(self, dflash: DFlashProposer):
        self.dflash = dflash
        self.drafter = dflash.drafter
        self.feature_layers = dflash.feature_layers
        self.num_draft_tokens = dflash.num_draft_tokens
        self.acceptance_prior = dflash.acceptance_prior
        self._unread: Tensor | None = None  # [batch, tokens, taps * hidden] not yet drafted over

    def start(self, prompt_ids: list[int]) -> None:
        self.dflash.start(prompt_ids)
        self._unread = None

    def propose(self, context: DraftContext) -> Proposal:
        features = context.new_features
        if self._unread is not None:
            features = torch.cat([self._unread, features], dim=1)
        limit = min(self.num_draft_tokens, context.max_slots)
        hints = self.dflash.matcher.hints(context.tokens, limit)  # [limit]
        if limit and hints[0] != NO_HINT:
            self._unread = features
            return Proposal(draft_tokens=hints[None])
        self._unread = None
        return self.dflash.propose(replace(context, new_features=features))
