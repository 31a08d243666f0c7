"""Turning next-token logits into probabilities and tokens (temperature, top-k, top-p)."""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.contracts import SamplingParams
from dcoco.models.cpu.row_reduce import row_argmax


def logits_to_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Float32 probabilities after temperature, top-k and top-p; a one-hot argmax when greedy."""
    # [..., vocab] -> [..., vocab]
    logits = logits.float()
    vocab = logits.shape[-1]
    if params.greedy:
        # torch.argmax breaks ties towards the lowest index, which keeps greedy deterministic.
        top = logits.argmax(dim=-1, keepdim=True)  # [..., 1]
        return torch.zeros_like(logits).scatter_(-1, top, 1.0)
    scaled = logits / params.temperature  # [..., vocab]
    if 0 < params.top_k < vocab:
        # Scatter the top-k indices rather than thresholding on the k-th value, so that ties at
        # the boundary still leave exactly k tokens.
        top_k = torch.topk(scaled, params.top_k, dim=-1).indices  # [..., top_k]
        keep = torch.zeros_like(scaled, dtype=torch.bool).scatter_(-1, top_k, True)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)  # [..., vocab]
    if params.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # [..., vocab]
        # A token stays while the mass strictly before it is short of top_p: this is the smallest
        # prefix reaching top_p, and the top token (mass before it 0) always stays.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., vocab]
        keep_sorted = mass_before < params.top_p
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row of `probs` (rows need not be normalised), one uniform a row
    (inverse_cdf)."""
    # [..., vocab] -> [...] int64
    rows = probs.reshape(-1, probs.shape[-1])  # [rows, vocab]
    uniforms = torch.rand(
        rows.shape[0], generator=generator, dtype=torch.float64, device=probs.device
    )  # [rows]
    return inverse_cdf(rows, uniforms).reshape(probs.shape[:-1])


def inverse_cdf(rows: Tensor, uniforms: Tensor) -> Tensor:
    """For each row of `rows` [rows, vocab] (any positive mass) the first token whose cumulative
    mass exceeds its uniform [rows] in [0, 1) times the row's total: int64 [rows].

    torch.multinomial and Gumbel noise (`exponential_`) each took about 1 ms a 49,152-token row on
    a 2-core Xeon, this 0.07-0.1 ms (scripts/reproduce/sampler_cost.py). A token of zero mass never
    comes out: its cumulative sum equals its predecessor's."""
    # float64: a float32 running sum over 49,152 terms drifts by ~1e-5 of the mass
    cumulative = rows.double().cumsum(dim=-1)  # [rows, vocab]
    total = cumulative[:, -1:]  # [rows, 1]
    if not bool((total > 0).all()):
        raise ValueError("sampling needs a positive mass in every row")
    # below the total even where u * total rounds up to it
    below = torch.nextafter(total, torch.zeros_like(total))
    threshold = torch.minimum(uniforms[:, None].double() * total, below)  # [rows, 1]
    return torch.searchsorted(cumulative, threshold, right=True).squeeze(-1)  # [rows]


def sample_from_logits(
    logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> Tensor:
    """Argmax when greedy, otherwise a draw from the filtered distribution."""
    # [..., vocab] -> [...] int64
    if params.greedy:
        return row_argmax(logits)  # = logits.argmax(dim=-1), several times cheaper on a CPU
    return sample(logits_to_probs(logits, params), generator)
