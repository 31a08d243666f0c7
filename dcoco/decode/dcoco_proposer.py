"""The DCOCO proposer: the DFlash drafter's one pass, then the corrector rescores the block's top-K
candidates and a selection rule picks one per slot (a deterministic proposal)."""

from __future__ import annotations

import torch

from dcoco.contracts import Proposal
from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.proposers import DraftContext
from dcoco.decode.selection import SELECTION_RULES, selected_token_ids
from dcoco.errors import DcocoError
from dcoco.models.corrector import Corrector
from dcoco.models.drafter import BlockDrafter


class DcocoProposer(DFlashProposer):
    name = "dcoco"

    def __init__(
        self,
        drafter: BlockDrafter,
        corrector: Corrector,
        selection: str = "greedy",
        num_draft_tokens: int | None = None,
    ):
        super().__init__(drafter, num_draft_tokens)
        if selection not in SELECTION_RULES:
            raise DcocoError(
                f"unknown selection '{selection}': choose one of {', '.join(SELECTION_RULES)}"
            )
        drafter_config, corrector_config = drafter.config, corrector.config
        if corrector_config.hidden_size != drafter_config.hidden_size:
            raise DcocoError(
                f"corrector hidden size {corrector_config.hidden_size} does not match the "
                f"drafter's {drafter_config.hidden_size}"
            )
        if corrector_config.top_k > drafter_config.vocab_size:
            raise DcocoError(
                f"corrector top-k {corrector_config.top_k} exceeds the vocab size "
                f"{drafter_config.vocab_size}"
            )
        self.corrector = corrector
        self.selection = selection

    @torch.inference_mode()
    def propose(self, context: DraftContext) -> Proposal:
        # Cut to this cycle's slots before scoring, so the path rules weigh only proposed slots.
        logits, hidden = self.draft_block(context)  # [batch, slots, vocab], [batch, slots, hidden]
        scores = self.corrector(hidden, logits)
        indices = SELECTION_RULES[self.selection](scores)  # [batch, slots]
        return Proposal(draft_tokens=selected_token_ids(scores, indices))
