"""The DCOCO corrector: rescore a parallel draft's top-K candidates jointly over adjacent slots.

A block drafter predicts every slot independently, so its argmax draft may pair tokens that do not
fit together. The corrector reads only what the drafter's one pass already produced (per-slot
hidden states and logits) and scores every transition from candidate a at slot p to candidate b at
slot p + 1:

    S[p, a, b] = L[p + 1, b] + delta(s_p, z[p, a], L[p, a], z[p + 1, b], L[p + 1, b])

L is the drafter's logit of a candidate, z a candidate representation (its token embedding fused
with its slot's hidden state) and s_p a state of the slot pair (p, p + 1). delta's output layer
starts at zero, so an untrained corrector keeps the drafter's own scores, S[p, a, b] = L[p + 1, b].
A selection rule (dcoco.models.selection), named by the caller, then walks S to pick one candidate
per slot.

The target's embedding is shared and frozen; like the drafter's, it is held outside the module's
registry so it never enters the state_dict or the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.heads import HeadBatch, HeadLoss
from dcoco.models.selection import (
    DEFAULT_SELECTION,
    SELECTION_RULES,
    Scores,
    check_selection,
    selected_token_ids,
)


@dataclass(frozen=True)
class CorrectorConfig:
    hidden_size: int  # the drafter's hidden size (= the target's embedding size)
    top_k: int = 16  # K: candidates kept per slot
    mlp_hidden: int = 256  # width of z, s_p and delta's hidden layer (shape word: mlp_hidden)
    use_pair_state: bool = True  # ablation: False -> s_p = 0
    use_candidate_repr: bool = True  # ablation: False -> z reads the slot's hidden state only

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.mlp_hidden < 1 or self.hidden_size < 1:
            raise DcocoError("a corrector needs hidden size, top-k and MLP width all >= 1")


class Corrector(nn.Module):
    """Transition scores over the drafter's top-K candidates. `embed_tokens` is the target's."""

    kind = "dcoco"

    def __init__(self, config: CorrectorConfig, embed_tokens: nn.Embedding):
        super().__init__()
        if embed_tokens.embedding_dim != config.hidden_size:
            raise DcocoError(
                f"corrector hidden size {config.hidden_size} does not match the embedding size "
                f"{embed_tokens.embedding_dim}"
            )
        self.config = config
        hidden, width = config.hidden_size, config.mlp_hidden
        # z[p, a] = silu(norm(W_h h[p] + W_e emb(a))): W_h runs once per slot, W_e per candidate.
        self.slot_proj = nn.Linear(hidden, width)
        self.token_proj = (
            nn.Linear(hidden, width, bias=False) if config.use_candidate_repr else None
        )
        self.candidate_norm = nn.LayerNorm(width)
        self.pair = (
            nn.Sequential(nn.Linear(2 * hidden, width), nn.LayerNorm(width), nn.SiLU())
            if config.use_pair_state
            else None
        )
        # delta's first layer reads [s_p ; z[p, a] ; L[p, a] ; z[p + 1, b] ; L[p + 1, b]]. Its
        # width stays the same in the ablations (s_p = 0 then), so every variant has one shape.
        self.delta_in = nn.Linear(3 * width + 2, width)
        self.delta_out = nn.Linear(width, 1)
        # Zero output: an untrained corrector changes nothing, so training starts at the drafter.
        nn.init.zeros_(self.delta_out.weight)
        nn.init.zeros_(self.delta_out.bias)
        # A tuple is not a Module, so nn.Module does not register (save, train or move) it.
        self._shared = (embed_tokens,)

    @property
    def dtype(self) -> torch.dtype:
        return self.delta_in.weight.dtype

    def candidate_repr(self, hidden: Tensor, candidate_ids: Tensor) -> Tensor:
        """z [batch, slots, K, mlp_hidden] from hidden [batch, slots, hidden] and candidate ids
        [batch, slots, K]."""
        fused = self.slot_proj(hidden.to(self.dtype))[:, :, None]  # [batch, slots, 1, mlp_hidden]
        if self.token_proj is not None:
            embeds = self._shared[0](candidate_ids).to(self.dtype)  # [batch, slots, K, hidden]
            fused = fused + self.token_proj(embeds)  # [batch, slots, K, mlp_hidden]
        z = F.silu(self.candidate_norm(fused))
        return z.expand(-1, -1, candidate_ids.shape[-1], -1)

    def pair_state(self, hidden: Tensor) -> Tensor:
        """s [batch, slots - 1, mlp_hidden]: one state per adjacent slot pair (p, p + 1)."""
        batch, slots = hidden.shape[:2]
        if self.pair is None:
            return hidden.new_zeros(batch, slots - 1, self.config.mlp_hidden, dtype=self.dtype)
        hidden = hidden.to(self.dtype)
        return self.pair(torch.cat([hidden[:, :-1], hidden[:, 1:]], dim=-1))

    def forward(self, hidden: Tensor, logits: Tensor) -> Scores:
        """Scores from one drafter pass: hidden [batch, slots, hidden], logits [batch, slots,
        vocab]. Needs slots >= 1 and K <= vocab."""
        # Sorted, so index 0 at each slot is the drafter's own argmax token.
        candidate_logits, candidate_ids = logits.float().topk(self.config.top_k, dim=-1)
        return self.score(hidden, candidate_logits, candidate_ids)

    def score(self, hidden: Tensor, candidate_logits: Tensor, candidate_ids: Tensor) -> Scores:
        """Scores of given candidates: ids and fp32 logits [batch, slots, K], sorted descending."""
        z = self.candidate_repr(hidden, candidate_ids)  # [batch, slots, K, mlp_hidden]
        # [batch, slots, K, mlp_hidden + 1]: what delta reads of one candidate
        candidates = torch.cat([z, candidate_logits[..., None].to(self.dtype)], dim=-1)
        # Split delta's first layer by input block, so each block is projected once (per pair,
        # per candidate at p, per candidate at p + 1) and the K x K grid is only a broadcast sum.
        width = self.config.mlp_hidden
        w_pair, w_from, w_to = self.delta_in.weight.split([width, width + 1, width + 1], dim=1)
        pre = (
            F.linear(self.pair_state(hidden), w_pair, self.delta_in.bias)[:, :, None, None]
            + F.linear(candidates[:, :-1], w_from)[:, :, :, None]  # a at slot p
            + F.linear(candidates[:, 1:], w_to)[:, :, None, :]  # b at slot p + 1
        )  # [batch, slots - 1, K, K, mlp_hidden]
        delta = self.delta_out(F.silu(pre)).squeeze(-1)  # [batch, slots - 1, K, K]
        # L stays fp32 (not the corrector's dtype), so a bf16 corrector cannot round distinct
        # logits into ties.
        transitions = candidate_logits[:, 1:, None, :] + delta.float()
        return Scores(candidate_ids, candidate_logits, transitions)

    def select(
        self,
        hidden: Tensor,
        logits: Tensor,
        anchor_ids: Tensor,
        selection: str | None = None,
    ) -> Tensor:
        """Draft token ids [batch, slots] by the rule named `selection` (default: greedy)."""
        rule = SELECTION_RULES[check_selection(selection or DEFAULT_SELECTION)]
        scores = self(hidden, logits)
        return selected_token_ids(scores, rule(scores))

    def training_loss(self, batch: HeadBatch) -> HeadLoss:
        """Cross-entropy over the K x K transitions of each adjacent slot pair, labelled with the
        target's own token pair; a pair whose labels are not both among the candidates is masked.
        Pair (p, p + 1) weighs exp(-p / gamma), like its first slot."""
        top_k = self.config.top_k
        candidate_logits, columns = batch.logits.float().topk(top_k, dim=-1)  # [blocks, slots, K]
        candidate_ids = columns if batch.vocab_ids is None else batch.vocab_ids[columns]
        scores = self.score(batch.hidden, candidate_logits, candidate_ids)
        hit = candidate_ids == batch.label_ids[..., None]  # [blocks, slots, K]
        present = hit.any(dim=-1)  # [blocks, slots]
        where = hit.long().argmax(dim=-1)  # [blocks, slots]: the label's candidate index
        valid = present[:, :-1] & present[:, 1:]  # [blocks, slots - 1]
        pair_target = where[:, :-1] * top_k + where[:, 1:]
        ce = F.cross_entropy(
            scores.transitions.flatten(2).flatten(0, 1),  # [blocks * (slots - 1), K * K]
            pair_target.flatten(),
            reduction="none",
        ).view_as(valid)
        pair_weights = batch.slot_weights[:-1].to(ce.dtype)  # [slots - 1]
        weighted = (ce * pair_weights * valid).sum()
        # The prefix-first walk, teacher-forced: slot 0 is the drafter's top-1; slot p + 1 is the
        # best successor of the label at p (a walk that reached p chose the label there).
        rows = scores.transitions.gather(
            2, where[:, :-1, None, None].expand(-1, -1, 1, top_k)
        ).squeeze(2)  # [blocks, slots - 1, K]: S[p, label_p, :]
        successor = candidate_ids[:, 1:].gather(-1, rows.argmax(dim=-1, keepdim=True)).squeeze(-1)
        correct = torch.cat(
            [
                candidate_ids[:, :1, 0] == batch.label_ids[:, :1],
                present[:, :-1] & (successor == batch.label_ids[:, 1:]),
            ],
            dim=1,
        )
        return HeadLoss(weighted_loss=weighted, correct=correct)
