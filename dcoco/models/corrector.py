"""The DCOCO corrector: rescore a parallel draft's top-K candidates jointly over adjacent slots.

A block drafter predicts every slot independently, so its argmax draft may pair tokens that do not
fit together. The corrector reads only what the drafter's one pass already produced (per-slot
hidden states and logits) and scores every transition from candidate a at slot p to candidate b at
slot p + 1:

    S[p, a, b] = L[p + 1, b] + delta(s_p, z[p, a], L[p, a], z[p + 1, b], L[p + 1, b])

L is the drafter's logit of a candidate, z a candidate representation (its token embedding fused
with its slot's hidden state) and s_p a state of the slot pair (p, p + 1). Options, each a config
field whose default is the first corrector's:
- `features = "normalised"`: each candidate is described by its log-probability, probability, gap
  to the slot's top-1, rank and is-top-1 beside L (published selectors feed these, not raw logits);
- `successor_query`: delta gains a bilinear term <q(s_p, z[p, a]), E[b]> through the target's
  token embedding E: a shift of slot p + 1's hidden state toward what follows token a;
- `anchor`: slot 0 is re-selected too: the anchor token is a virtual slot before it (one
  candidate, slot 0's hidden state), so start[b] = S[anchor, b] comes from the same batched op.
delta's output layers start at zero, so an untrained corrector keeps the drafter's own scores,
S[p, a, b] = L[p + 1, b] and start = L[0]. A selection rule (dcoco.models.selection), named by the
caller, then walks S to pick one candidate per slot. Training losses: dcoco.models.corrector_loss.

The target's embedding is shared and frozen; like the drafter's, it is held outside the module's
registry so it never enters the state_dict or the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.corrector_loss import LOSSES, corrector_training_loss
from dcoco.models.heads import HeadBatch, HeadLoss
from dcoco.models.pair_counts import PairCounts
from dcoco.models.selection import (
    DEFAULT_SELECTION,
    SELECTION_RULES,
    Scores,
    check_selection,
    selected_token_ids,
)

FEATURES = ("logit", "normalised")
# What delta reads of one candidate besides z: L, then (normalised) log p, p, L - L_top1,
# rank / K, is-top-1 and is-anchor.
FEATURE_WIDTH = {"logit": 1, "normalised": 7}
MAX_PAIRS = 16  # slot pairs with a weight of their own for the pair counts (blocks up to 16)


@dataclass(frozen=True)
class CorrectorConfig:
    hidden_size: int  # the drafter's hidden size (= the target's embedding size)
    top_k: int = 16  # K: candidates kept per slot
    mlp_hidden: int = 256  # width of z, s_p and delta's hidden layer (shape word: mlp_hidden)
    use_pair_state: bool = True  # ablation: False -> s_p = 0
    use_candidate_repr: bool = True  # ablation: False -> z reads the slot's hidden state only
    features: str = "logit"  # candidate features: logit (L only) or normalised
    successor_query: bool = False  # add the bilinear term <q(s_p, z_a), E[b]>
    anchor: bool = False  # re-select slot 0 from the anchor token
    pair_counts: int = 0  # > 0: read counted log P(b | a), a table of this many pairs
    vocab_size: int = 0  # the vocabulary the pair counts index (0 = none: no pair counts)
    loss: str = "pairs"  # training loss: pairs (one softmax over K x K) or conditional

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.mlp_hidden < 1 or self.hidden_size < 1:
            raise DcocoError("a corrector needs hidden size, top-k and MLP width all >= 1")
        if self.features not in FEATURES:
            raise DcocoError(f"corrector features must be one of {', '.join(FEATURES)}")
        if self.loss not in LOSSES:
            raise DcocoError(f"corrector loss must be one of {', '.join(LOSSES)}")
        if self.pair_counts < 0 or (self.pair_counts and self.vocab_size < 1):
            raise DcocoError("a corrector with pair counts needs its vocab size")


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
        # delta's first layer reads [s_p ; z[p, a] ; f[p, a] ; z[p + 1, b] ; f[p + 1, b]] (f: the
        # candidate features). Its width stays the same in the ablations (s_p = 0 then).
        features = FEATURE_WIDTH[config.features]
        self.delta_in = nn.Linear(3 * width + 2 * features, width)
        self.delta_out = nn.Linear(width, 1)
        # Zero output: an untrained corrector changes nothing, so training starts at the drafter.
        nn.init.zeros_(self.delta_out.weight)
        nn.init.zeros_(self.delta_out.bias)
        if config.successor_query:
            # q = W_q2 silu(W_q1 [s_p ; z_a]); only W_q2 starts at zero (E is frozen and nonzero).
            self.query_in = nn.Linear(2 * width, width)
            self.query_out = nn.Linear(width, hidden, bias=False)
            nn.init.zeros_(self.query_out.weight)
        if config.pair_counts:
            # log P(b | a) enters delta's hidden layer (bigram_in) and S itself, with a weight
            # per slot pair that starts at zero (bigram_scale), so S starts at L.
            self.pair_counts = PairCounts(config.pair_counts, config.vocab_size)
            self.bigram_in = nn.Parameter(torch.randn(width) / width**0.5)
            self.bigram_scale = nn.Parameter(torch.zeros(MAX_PAIRS))
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

    def candidate_features(self, logits: Tensor, logsumexp: Tensor | None) -> Tensor:
        """f [batch, slots, K, features] from candidate logits [batch, slots, K] (sorted) and the
        slots' log normalisers [batch, slots] (None: from the candidates alone)."""
        if self.config.features == "logit":
            return logits[..., None]
        if logsumexp is None:
            logsumexp = logits.logsumexp(dim=-1)
        log_probs = logits - logsumexp[..., None]
        top_k = logits.shape[-1]
        rank = torch.arange(top_k, device=logits.device, dtype=logits.dtype) / top_k
        columns = [
            logits,
            log_probs,
            log_probs.exp(),
            logits - logits[..., :1],
            rank.expand_as(logits),
            (rank == 0).to(logits.dtype).expand_as(logits),
            torch.zeros_like(logits),  # is-anchor
        ]
        return torch.stack(columns, dim=-1)

    def forward(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor | None = None) -> Scores:
        """Scores from one drafter pass: hidden [batch, slots, hidden], logits [batch, slots,
        vocab], anchor_ids [batch] (needed with `anchor`). Needs K <= vocab."""
        logits = logits.float()  # once: both reductions below read the whole vocabulary
        # Sorted, so index 0 at each slot is the drafter's own argmax token.
        candidate_logits, candidate_ids = logits.topk(self.config.top_k, dim=-1)
        logsumexp = logits.logsumexp(dim=-1) if self.config.features != "logit" else None
        return self.score(hidden, candidate_logits, candidate_ids, logsumexp, anchor_ids)

    def score(
        self,
        hidden: Tensor,
        candidate_logits: Tensor,
        candidate_ids: Tensor,
        logsumexp: Tensor | None = None,
        anchor_ids: Tensor | None = None,
    ) -> Scores:
        """Scores of given candidates: ids and fp32 logits [batch, slots, K], sorted descending;
        the slots' log normalisers [batch, slots] for normalised features."""
        features = self.candidate_features(candidate_logits, logsumexp)
        z_hidden, ids = hidden, candidate_ids
        if self.config.anchor:
            if anchor_ids is None:
                raise DcocoError("a corrector that re-selects slot 0 needs the anchor ids")
            z_hidden, ids, features = self._with_anchor(hidden, candidate_ids, features, anchor_ids)
        z = self.candidate_repr(z_hidden, ids)  # [batch, slots', K, mlp_hidden]
        candidates = torch.cat([z, features.to(self.dtype)], dim=-1)
        pair = self.pair_state(z_hidden)  # [batch, slots' - 1, mlp_hidden]
        # Split delta's first layer by input block, so each block is projected once (per pair,
        # per candidate at p, per candidate at p + 1) and the K x K grid is only a broadcast sum.
        width, feature_width = self.config.mlp_hidden, features.shape[-1]
        w_pair, w_from, w_to = self.delta_in.weight.split(
            [width, width + feature_width, width + feature_width], dim=1
        )
        pre = (
            F.linear(pair, w_pair, self.delta_in.bias)[:, :, None, None]
            + F.linear(candidates[:, :-1], w_from)[:, :, :, None]  # a at slot p
            + F.linear(candidates[:, 1:], w_to)[:, :, None, :]  # b at slot p + 1
        )  # [batch, slots' - 1, K, K, mlp_hidden]
        counted = None
        if self.config.pair_counts:
            counted = self.pair_counts(ids[:, :-1], ids[:, 1:])  # [batch, slots' - 1, K, K]
            pre = pre + (counted.clamp(min=-30.0) / 10.0).to(self.dtype)[..., None] * self.bigram_in
        delta = self.delta_out(F.silu(pre)).squeeze(-1).float()  # [batch, slots' - 1, K, K]
        if self.config.successor_query:
            delta = delta + self._query_term(pair, z[:, :-1], ids[:, 1:])
        if counted is not None:
            pairs = torch.arange(counted.shape[1], device=counted.device).clamp(max=MAX_PAIRS - 1)
            delta = delta + self.bigram_scale[pairs].float()[None, :, None, None] * counted
        # L stays fp32 (not the corrector's dtype), so a bf16 corrector cannot round distinct
        # logits into ties.
        transitions = candidate_logits[:, 0 if self.config.anchor else 1 :, None, :] + delta
        if not self.config.anchor:
            return Scores(candidate_ids, candidate_logits, transitions)
        # The anchor's K rows are one candidate repeated: its row 0 is slot 0's start scores.
        return Scores(candidate_ids, candidate_logits, transitions[:, 1:], transitions[:, 0, 0])

    def _with_anchor(self, hidden, candidate_ids, features, anchor_ids):
        """hidden, ids and features with the anchor as a virtual slot before slot 0: slot 0's
        hidden state, the anchor token as every candidate, features of a certain top-1."""
        anchor_features = torch.zeros_like(features[:, :1])  # [batch, 1, K, features]
        if self.config.features == "normalised":  # log p = gap = rank = 0: p, top-1, anchor = 1
            anchor_features[..., 2] = 1.0
            anchor_features[..., 5:] = 1.0
        ids = anchor_ids.view(-1, 1, 1).expand(-1, 1, candidate_ids.shape[-1])
        return (
            torch.cat([hidden[:, :1], hidden], dim=1),
            torch.cat([ids.to(candidate_ids.dtype), candidate_ids], dim=1),
            torch.cat([anchor_features, features], dim=1),
        )

    def _query_term(self, pair: Tensor, z_from: Tensor, to_ids: Tensor) -> Tensor:
        """<q(s_p, z[p, a]), E[b]> / sqrt(hidden) [batch, slots - 1, K, K]."""
        pair = pair[:, :, None].expand(-1, -1, z_from.shape[2], -1)
        query = self.query_out(F.silu(self.query_in(torch.cat([pair, z_from], dim=-1))))
        successors = self._shared[0](to_ids).to(self.dtype)  # [batch, slots - 1, K, hidden]
        scale = self.config.hidden_size**-0.5
        return torch.einsum("bpah,bpkh->bpak", query, successors).float() * scale

    def select(
        self,
        hidden: Tensor,
        logits: Tensor,
        anchor_ids: Tensor,
        selection: str | None = None,
    ) -> Tensor:
        """Draft token ids [batch, slots] by the rule named `selection` (default: greedy)."""
        rule = SELECTION_RULES[check_selection(selection or DEFAULT_SELECTION)]
        scores = self(hidden, logits, anchor_ids)
        return selected_token_ids(scores, rule(scores))

    def training_loss(self, batch: HeadBatch) -> HeadLoss:
        """The loss named by the config (dcoco.models.corrector_loss) and the walk's
        teacher-forced correctness."""
        return corrector_training_loss(self, batch)
