"""Exact argmax and top-k over long rows (a vocabulary's logits), by group maxima.

torch's CPU `argmax` and `topk` over a row of 16,000-49,152 logits cost 20-40 us a row, several
times a plain max reduction over the same numbers (Intel Xeon model 207, 2 threads: `topk(16)`
over 32 x 16,000 fp32 0.80 ms, `argmax` over them in bf16 1.20 ms, `amax` 0.07 ms). A drafter
takes one of them for every drafted slot (its top-1, or the corrector's top-K), so at 16-32 served
requests they cost milliseconds a step. Both functions here first reduce a row to the maxima of
its groups of GROUP adjacent columns (one vectorised `amax`), then search only the chosen groups:

- `row_argmax`: the first group whose maximum is the row's, then the first column in it holding
  that value: the first occurrence of the maximum, what `torch.argmax` returns (NaN included: a
  NaN row maximum is found the same way).
- `row_topk`: the k groups with the largest maxima hold the k largest values (fewer than k groups
  can have a maximum above the k-th largest value), so `topk` over their k x GROUP columns gives
  the row's k largest values, sorted. Among equal values the indices are the ones `topk` picks,
  which torch does not specify for its own `topk` either.

Rows shorter than a few groups per candidate go to torch directly, and so do top-k rows whose
length is not a multiple of GROUP (vocabularies usually are). Measured by
scripts/reproduce/row_reduce_cost.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dcoco.models.cpu import cpu_kernels

GROUP = 128  # columns per group: the cheapest of 32-256 for 16,000 and 49,152 columns (model 207)


def row_argmax(rows: Tensor, fused: bool = True) -> Tensor:
    """argmax over the last dim of rows [..., N] (int64 [...]), equal to `rows.argmax(-1)`.
    With `fused`, fp32 and bf16 CPU rows take the fused kernel where it builds (one pass for the
    maximum, one for its first index: 3 rows of 16,000 fp32 in 9.7 µs against 60 µs by group
    maxima and 41-54 µs by torch's argmax, Zen 4 EPYC); the vLLM plugin passes False (no kernel
    build inside a serving worker)."""
    if fused and rows.numel() and cpu_kernels.takes_rows(rows):
        flat = rows.reshape(-1, rows.shape[-1])
        return cpu_kernels.kernels().row_argmax(flat).view(rows.shape[:-1])
    columns = rows.shape[-1]
    if columns < 4 * GROUP or rows.numel() == 0:
        return rows.argmax(dim=-1)
    groups = _grouped(rows)  # [R, G, GROUP]
    best_group = groups.amax(dim=-1).argmax(dim=-1)  # [R]
    within = groups[torch.arange(groups.shape[0], device=rows.device), best_group].argmax(dim=-1)
    return (best_group * GROUP + within).view(rows.shape[:-1])


def row_topk(rows: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values over the last dim of rows [..., N], descending, and their indices
    ([..., k] each): the values of `rows.topk(k, dim=-1)`."""
    columns = rows.shape[-1]
    # A padded last group could hand out columns past the row where -inf values tie (a draft
    # vocabulary's logits spread over every token): such rows go to torch.
    if columns < 4 * GROUP * k or columns % GROUP or rows.numel() == 0:
        top = rows.topk(k, dim=-1)
        return top.values, top.indices
    groups = rows.reshape(-1, columns // GROUP, GROUP)  # [R, G, GROUP]
    count = groups.shape[0]
    chosen = groups.amax(dim=-1).topk(k, dim=-1).indices  # [R, k]
    candidates = groups.gather(1, chosen[..., None].expand(count, k, GROUP))  # [R, k, GROUP]
    top = candidates.view(count, k * GROUP).topk(k, dim=-1)
    indices = chosen.gather(1, top.indices // GROUP) * GROUP + top.indices % GROUP
    shape = (*rows.shape[:-1], k)
    return top.values.view(shape), indices.view(shape)


def _grouped(rows: Tensor) -> Tensor:
    """rows [..., N] as [R, G, GROUP], the last group filled out with -inf (after every real
    column, so it never holds a first occurrence)."""
    flat = rows.reshape(-1, rows.shape[-1])
    tail = -flat.shape[-1] % GROUP
    if tail:
        flat = F.pad(flat, (0, tail), value=float("-inf"))
    return flat.view(flat.shape[0], -1, GROUP)
