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
S[p, a, b] = L[p + 1, b] and start = L[0]. A selection rule (dcoco.models.heads.selection), named
by the caller, then walks S to pick one candidate per slot. Training losses:
dcoco.models.heads.corrector_loss.

The target's embedding is shared and frozen; like the drafter's, it is held outside the module's
registry so it never enters the state_dict or the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.heads.base import HeadBatch, HeadLoss
from dcoco.models.heads.candidate_features import (
    FEATURE_WIDTH,
    FEATURES,
    candidate_features,
    top_candidates,
    with_anchor_slot,
)
from dcoco.models.heads.corrector_loss import LOSSES, corrector_training_loss
from dcoco.models.heads.grid_parts import MAX_PAIRS, GridParts, query_term
from dcoco.models.heads.pair_counts import PairCounts
from dcoco.models.heads.pair_grid import GridScratch
from dcoco.models.heads.selection import (
    DEFAULT_SELECTION,
    SELECTION_RULES,
    WALKS,
    Scores,
    split_selection,
)
from dcoco.models.heads.vocab_table import VocabTable


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
        # Inference caches (never saved): the grid's buffer and the tabled embedding projections.
        self._grid_scratch = GridScratch()
        if self.token_proj is not None:
            self._token_table = VocabTable(self.token_proj)
        if config.successor_query:
            self._successor_table = VocabTable(lambda rows: rows @ self.query_out.weight)

    @property
    def dtype(self) -> torch.dtype:
        return self.delta_in.weight.dtype

    def candidate_repr(self, hidden: Tensor, candidate_ids: Tensor) -> Tensor:
        """z [batch, slots, K, mlp_hidden] from hidden [batch, slots, hidden] and candidate ids
        [batch, slots, K]."""
        fused = self.slot_proj(hidden.to(self.dtype))[:, :, None]  # [batch, slots, 1, mlp_hidden]
        if self.token_proj is not None:
            fused = fused + self._projected_embeds(candidate_ids)  # [batch, slots, K, mlp_hidden]
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
        """dcoco.models.heads.candidate_features for this corrector's kind and trained top-k."""
        return candidate_features(logits, logsumexp, self.config.features, self.config.top_k)

    def forward(
        self,
        hidden: Tensor,
        logits: Tensor,
        anchor_ids: Tensor | None = None,
        top_k: int | None = None,
    ) -> Scores:
        """Scores from one drafter pass: hidden [batch, slots, hidden], logits [batch, slots,
        vocab], anchor_ids [batch] (needed with `anchor`); `top_k` candidates per slot, at most
        the trained K (None: K). Needs K <= vocab."""
        return self.draft_parts(hidden, logits, anchor_ids, top_k).scores(self)

    def draft_parts(
        self, hidden, logits, anchor_ids=None, top_k: int | None = None, column_ids=None
    ) -> GridParts:
        """grid_parts of one drafter pass's top `top_k` candidates per slot (forward's inputs);
        `column_ids` [N]: the token id of each logits column (a draft vocabulary), else None."""
        if top_k and top_k > self.config.top_k:
            raise DcocoError(
                f"the corrector was trained on the top {self.config.top_k} candidates; it cannot "
                f"walk {top_k}"
            )
        candidate_logits, candidate_ids, logsumexp = top_candidates(
            logits, top_k or self.config.top_k, normaliser=self.config.features != "logit"
        )
        if column_ids is not None:
            candidate_ids = column_ids[candidate_ids]
        return self.grid_parts(hidden, candidate_logits, candidate_ids, logsumexp, anchor_ids)

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
        parts = self.grid_parts(hidden, candidate_logits, candidate_ids, logsumexp, anchor_ids)
        return parts.scores(self)

    def grid_parts(
        self,
        hidden: Tensor,
        candidate_logits: Tensor,
        candidate_ids: Tensor,
        logsumexp: Tensor | None = None,
        anchor_ids: Tensor | None = None,
    ) -> GridParts:
        """Everything the transition scores are assembled from (dcoco.models.heads.grid_parts):
        delta's
        first layer projected once per slot pair and per candidate, and the successor query."""
        features = self.candidate_features(candidate_logits, logsumexp)
        z_hidden, ids = hidden, candidate_ids
        if self.config.anchor:
            if anchor_ids is None:
                raise DcocoError("a corrector that re-selects slot 0 needs the anchor ids")
            z_hidden, ids, features = with_anchor_slot(
                hidden, candidate_ids, features, anchor_ids, self.config.features
            )
        z = self.candidate_repr(z_hidden, ids)  # [batch, slots', K, mlp_hidden]
        candidates = torch.cat([z, features.to(self.dtype)], dim=-1)
        pair = self.pair_state(z_hidden)  # [batch, slots' - 1, mlp_hidden]
        # Split delta's first layer by input block, so each block is projected once (per pair,
        # per candidate at p, per candidate at p + 1) and the K x K grid is only a broadcast sum.
        width, feature_width = self.config.mlp_hidden, features.shape[-1]
        w_pair, w_from, w_to = self.delta_in.weight.split(
            [width, width + feature_width, width + feature_width], dim=1
        )
        counted = query_dots = None
        if self.config.pair_counts:
            counted = self.pair_counts(ids[:, :-1], ids[:, 1:])  # [batch, slots' - 1, K, K]
        if self.config.successor_query:
            query, successors = self._query_parts(pair, z[:, :-1], ids[:, 1:])
            query_dots = query_term(query, successors, self.config.hidden_size)
        return GridParts(
            candidate_ids=candidate_ids,
            candidate_logits=candidate_logits,
            pair=F.linear(pair, w_pair, self.delta_in.bias),
            from_pre=F.linear(candidates[:, :-1], w_from),  # a at slot p
            to_pre=F.linear(candidates[:, 1:], w_to),  # b at slot p + 1
            counted=counted,
            query_dots=query_dots,
            anchor=self.config.anchor,
        )

    def prepare_inference(self, frozen: bool = False) -> None:
        """Build the vocabulary tables now: built on first use, a decode loop would time their
        build (0.4 s in fp32 on a Zen 3) as part of its first draft. `frozen`: the weights and
        the embedding never change again, so the tables are never checked (VocabTable.freeze)."""
        embedding = self._shared[0].weight
        if self.token_proj is not None:
            self._token_table.build(embedding, (self.token_proj.weight,), self.dtype)
        if self.config.successor_query:
            self._successor_table.build(embedding, (self.query_out.weight,), self.dtype)
        for table in self._tables() if frozen else ():
            table.freeze()

    def defer_tables(self) -> None:
        """Until `prepare_inference(frozen=True)` has run (in another thread), project the
        candidates' embeddings directly instead of building the tables on first use: a served
        head's first steps do not wait for them (0.4 s in fp32, seconds in emulated bf16)."""
        for table in self._tables():
            table.deferred = True

    def _tables(self) -> list[VocabTable]:
        names = ("_token_table", "_successor_table")
        return [getattr(self, name) for name in names if hasattr(self, name)]

    def _projected_embeds(self, ids: Tensor) -> Tensor:
        """token_proj(E[ids]) [..., mlp_hidden]; at inference a row gather from its table."""
        embedding = self._shared[0]
        if torch.is_grad_enabled():
            return self.token_proj(embedding(ids).to(self.dtype))
        weights = (self.token_proj.weight,)
        return self._token_table.rows(ids, embedding.weight, weights, self.dtype)

    def _query_parts(self, pair: Tensor, z_from: Tensor, to_ids: Tensor) -> tuple[Tensor, Tensor]:
        """The successor term's two sides: u [batch, slots - 1, K, mlp_hidden], once per pair and
        candidate a, and what it meets for candidate b [batch, slots - 1, K, *]: E[b] in training
        (u is then W_q2 u), W_q2^T E[b] from a vocabulary table at inference (equal up to
        rounding, without the per-candidate W_q2 product); grid_parts.query_term dots them."""
        width = self.config.mlp_hidden
        w_pair, w_from = self.query_in.weight.split([width, width], dim=1)
        pre = F.linear(pair, w_pair, self.query_in.bias)[:, :, None] + F.linear(z_from, w_from)
        query = F.silu(pre)
        embedding = self._shared[0]
        if torch.is_grad_enabled():
            return self.query_out(query), embedding(to_ids).to(self.dtype)
        weights = (self.query_out.weight,)
        return query, self._successor_table.rows(to_ids, embedding.weight, weights, self.dtype)

    def select(
        self,
        hidden: Tensor,
        logits: Tensor,
        anchor_ids: Tensor,
        selection: str | None = None,
        column_ids: Tensor | None = None,
    ) -> Tensor:
        """Draft token ids [batch, slots] by the rule named `selection` (default: greedy), over
        the top K candidates it names (`greedy/4`; default: the trained top-k). Outside autograd
        and on large enough grids the prefix-first walks score only the rows they read.
        `column_ids`: as for draft_parts."""
        rule, top_k = split_selection(selection or DEFAULT_SELECTION)
        parts = self.draft_parts(hidden, logits, anchor_ids, top_k, column_ids)
        if rule in WALKS and parts.walk_pays():
            indices = parts.walk(self, WALKS[rule])  # [batch, slots]
        else:
            indices = SELECTION_RULES[rule](parts.scores(self))
        return parts.candidate_ids.gather(-1, indices[..., None]).squeeze(-1)

    def training_loss(self, batch: HeadBatch) -> HeadLoss:
        """The loss named by the config (dcoco.models.heads.corrector_loss) and the walk's
        teacher-forced correctness."""
        return corrector_training_loss(self, batch)
