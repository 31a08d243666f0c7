"""What the corrector's transition scores are assembled from, and the two ways to assemble them.

`GridParts.scores` builds the whole grid S[p, a, b] for every slot pair (training, and the rules
that read all of it: `global`, `discounted`). The prefix-first walk (`greedy`, `keep1`) reads one
row of it per slot pair, S[p, k[p], :], the row of the candidate it chose at p. `GridParts.walk`
runs delta's hidden layer on those rows only: K vectors of width mlp_hidden per slot pair where
the grid fills K x K (a 7-slot block at K = 16: 112 instead of 1,792). The terms without that
width (the pair counts, the successor query's dot products) stay whole grids, made once for
both. Each row is computed by the grid's operations in the grid's order
(dcoco.models.heads.pair_grid)
from the same parts, so the walk picks what the grid's walk picks (tests/test_grid_parts.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dcoco.models.heads.pair_grid import delta_grid
from dcoco.models.heads.selection import Scores

MAX_PAIRS = 16  # slot pairs with a weight of their own for the pair counts (blocks up to 16)
# When the walk's rows, a few small operations each, cost less than the whole grid
# (scripts/reproduce/corrector_cost.py; docs/lab/results.md): from WALK_MIN_K
# candidates on at any size (one request, 1-7 slots, bf16 on an Intel Xeon with AMX: 0.77-0.86x
# the grid's time at K = 16, 0.87-1.00x at K = 8; on an AVX2 Zen 3 the two were level at K = 16),
# and at fewer candidates from WALK_MIN_CELLS transitions (batch x pairs x K x K) on (at K = 4 the
# grid was 1.2x cheaper for one 7-slot block on the Zen 3, level on the Xeon).
WALK_MIN_K = 8
WALK_MIN_CELLS = 4096


@dataclass
class GridParts:
    """S's inputs for one drafted block; slots' = slots + 1 when the corrector re-selects slot 0
    (the anchor as a virtual slot before it), else slots. Pairs are the slots' - 1 adjacent ones."""

    candidate_ids: Tensor  # [batch, slots, K] the drafter's top-K, descending
    candidate_logits: Tensor  # [batch, slots, K] fp32
    pair: Tensor  # [batch, pairs, width] the pair state's part of delta_in, its bias included
    from_pre: Tensor  # [batch, pairs, K, width] candidate a at slot p
    to_pre: Tensor  # [batch, pairs, K, width] candidate b at slot p + 1
    counted: Tensor | None  # [batch, pairs, K, K] fp32 log P(b | a) from the pair counts
    query_dots: Tensor | None  # [batch, pairs, K, K] fp32 the successor term
    anchor: bool

    def scores(self, corrector) -> Scores:
        """The whole grid: transitions [batch, slots - 1, K, K] (and the start scores)."""
        counted = self.counted
        delta = delta_grid(
            self.pair,
            self.from_pre,
            self.to_pre,
            corrector.delta_out,
            None if counted is None else scaled_counts(counted, corrector.dtype),
            corrector.bigram_in if counted is not None else None,
            corrector._grid_scratch,
        )  # [batch, pairs, K, K]
        if self.query_dots is not None:
            delta = delta + self.query_dots
        if counted is not None:
            pairs = torch.arange(counted.shape[1], device=counted.device).clamp(max=MAX_PAIRS - 1)
            delta = delta + corrector.bigram_scale[pairs].float()[None, :, None, None] * counted
        # L stays fp32 (not the corrector's dtype), so a bf16 corrector cannot round distinct
        # logits into ties.
        logits = self.candidate_logits
        transitions = logits[:, 0 if self.anchor else 1 :, None, :] + delta
        if not self.anchor:
            return Scores(self.candidate_ids, logits, transitions)
        # The anchor's K rows are one candidate repeated: its row 0 is slot 0's start scores.
        return Scores(self.candidate_ids, logits, transitions[:, 1:], transitions[:, 0, 0])

    def row(self, corrector, pair: int, index: Tensor, terms: RowTerms | None = None) -> Tensor:
        """S[pair, index, :] [batch, K] fp32 (the anchor's pair first, where there is one): the
        grid's operations on candidate `index` [batch] at the pair's first slot alone. `terms`:
        what every row reads (made once per walk; None: made here)."""
        terms = terms or self.row_terms(corrector, index.shape[0])
        batch = terms.batch
        chosen = self.from_pre[batch, pair, index]  # [batch, width]
        pre = (chosen + self.pair[:, pair])[:, None] + self.to_pre[:, pair]  # [batch, K, width]
        if terms.scaled is not None:
            pre.add_(terms.scaled[batch, pair, index][..., None] * corrector.bigram_in)
        delta = corrector.delta_out(F.silu(pre)).squeeze(-1).float()  # [batch, K]
        if self.query_dots is not None:
            delta = delta + self.query_dots[batch, pair, index]
        if terms.bigram_scale is not None:
            counted = self.counted[batch, pair, index]  # [batch, K]
            delta = delta + terms.bigram_scale[min(pair, MAX_PAIRS - 1)] * counted
        slot = pair if self.anchor else pair + 1  # the slot of candidate b
        return self.candidate_logits[:, slot] + delta

    def row_terms(self, corrector, batch: int) -> RowTerms:
        rows = torch.arange(batch, device=self.pair.device)
        if self.counted is None:
            return RowTerms(rows, None, None)
        scaled = scaled_counts(self.counted, corrector.dtype)  # the grid's, K x K per pair
        return RowTerms(rows, scaled, corrector.bigram_scale.float())

    def walk_pays(self) -> bool:
        """Whether `walk` beats `scores` here: outside autograd (training needs the whole grid),
        from WALK_MIN_K candidates or WALK_MIN_CELLS transitions on."""
        batch, pairs, top_k = self.from_pre.shape[:3]
        large = top_k >= WALK_MIN_K or batch * pairs * top_k * top_k >= WALK_MIN_CELLS
        return large and not torch.is_grad_enabled()

    def walk(self, corrector, from_start: bool) -> Tensor:
        """The prefix-first walk's candidate indices [batch, slots], one row per slot pair:
        `greedy` (from_start: slot 0 by the anchor's start scores where the corrector has them)
        or `keep1` (slot 0 keeps the drafter's top-1)."""
        index = torch.zeros_like(self.candidate_ids[:, 0, 0])  # [batch]
        terms = self.row_terms(corrector, index.shape[0])
        first = 0
        if self.anchor:
            first = 1  # pair 0 is anchor -> slot 0: only its start scores are read
            if from_start:
                index = self.row(corrector, 0, index, terms).argmax(dim=-1)
        path = [index]
        for pair in range(first, self.pair.shape[1]):
            index = self.row(corrector, pair, index, terms).argmax(dim=-1)
            path.append(index)
        return torch.stack(path, dim=1)


@dataclass
class RowTerms:
    batch: Tensor  # [batch] 0 .. batch - 1, the rows' own index
    scaled: Tensor | None  # [batch, pairs, K, K] the pair counts as delta's hidden layer reads them
    bigram_scale: Tensor | None  # [MAX_PAIRS] fp32, the pair counts' weight in S per slot pair


def scaled_counts(counted: Tensor, dtype: torch.dtype) -> Tensor:
    """The pair counts as delta's hidden layer reads them: clamped, scaled, in its dtype."""
    return (counted.clamp(min=-30.0) / 10.0).to(dtype)


def query_term(query: Tensor, successors: Tensor, hidden_size: int) -> Tensor:
    """<q(s_p, z[p, a]), E[b]> / sqrt(hidden) [batch, pairs, K, K] from query [batch, pairs, K,
    *] and successors [batch, pairs, K, *] (Corrector._query_parts)."""
    dots = torch.einsum("bpaw,bpkw->bpak", query, successors)
    return dots.float() * hidden_size**-0.5
