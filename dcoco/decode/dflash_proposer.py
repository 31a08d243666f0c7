"""The DFlash proposer: one non-causal drafter pass proposes the whole block (argmax per slot, or
for a sampled request with `sampled_drafts` a draw from the drafter's distribution per slot:
dcoco.decode.sampled_drafts).

The drafter keeps its own cache of context K/V (projected from target taps); each call feeds it the
taps of the tokens committed since the previous call, and `draft()` crops the block back out.
"""

from __future__ import annotations

from torch import Tensor

from dcoco.contracts import Proposal
from dcoco.decode.proposers import DraftContext
from dcoco.decode.sampled_drafts import sampled_proposal
from dcoco.errors import DcocoError
from dcoco.models.cpu.row_reduce import row_argmax
from dcoco.models.drafter.copy_hints import ContextMatcher
from dcoco.models.drafter.drafter import BlockDrafter


class DFlashProposer:
    name = "dflash"

    def __init__(
        self,
        drafter: BlockDrafter,
        num_draft_tokens: int | None = None,
        acceptance_prior: tuple[float, ...] = (),
        sampled_drafts: bool = False,
    ):
        """`acceptance_prior`: the checkpoint's per-slot held-out accuracy, which
        `--num-draft-tokens auto` starts from (dcoco.decode.draft_length). `sampled_drafts`:
        sampled requests get drafts drawn from the drafter's distribution."""
        slots = drafter.config.block_size - 1
        if num_draft_tokens is not None and not 1 <= num_draft_tokens <= slots:
            raise DcocoError(f"num-draft-tokens must be in 1..{slots} for this drafter")
        self.drafter = drafter
        self.feature_layers = tuple(drafter.config.target_layer_ids)
        self.num_draft_tokens = num_draft_tokens or slots
        self.acceptance_prior = acceptance_prior
        self.sampled_drafts = sampled_drafts
        self.cache = drafter.new_cache()
        self.matcher = ContextMatcher()  # the copy hints' n-gram matches in this reply

    def start(self, prompt_ids: list[int]) -> None:
        self.cache = self.drafter.new_cache()
        self.matcher = ContextMatcher()

    def propose(self, context: DraftContext) -> Proposal:
        logits, _hidden = self.draft_block(context)  # [batch, slots, vocab or N columns]
        if self.sampled_drafts and context.sampled:
            return self.sampled_proposal(logits, context)
        return Proposal(draft_tokens=self.drafter.token_ids(row_argmax(logits)))

    def sampled_proposal(self, logits: Tensor, context: DraftContext) -> Proposal:
        vocab = self.drafter.draft_vocab
        return sampled_proposal(
            logits,
            None if vocab is None else vocab.token_ids,
            self.drafter.config.vocab_size,
            context.sampling,
            context.generator,
        )

    def draft_block(self, context: DraftContext) -> tuple[Tensor, Tensor]:
        """One drafter pass: logits [batch, slots, vocab] (or the draft vocabulary's columns,
        BlockDrafter.token_ids) and hidden [batch, slots, hidden], cut to the slots this cycle
        may propose."""
        if context.new_features is None:
            raise ValueError(f"the {self.name} proposer needs the target's tapped features")
        limit = min(self.num_draft_tokens, context.max_slots)
        hints = None
        if self.drafter.config.copy_hints:  # every slot's, as in training, not only the proposed
            hints = self.matcher.hints(context.tokens, self.drafter.config.block_size - 1)[None]
        return self.drafter.draft(
            context.tokens[-1:], context.new_features, self.cache, num_slots=limit, hint_ids=hints
        )
