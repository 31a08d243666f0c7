"""Lossless verification of a drafted block against the target model.

Glossary:
  anchor           the last committed token; the target has not yet seen its K/V.
  draft tokens     the proposed continuation of the anchor, one per slot.
  target_probs     the target's next-token distribution at each block position: position i is
                   the distribution after anchor + draft_tokens[:i], so it judges draft slot i,
                   and position `slots` lies after the last draft.
  accepted prefix  the leading draft tokens the target keeps (`num_accepted` of them).
  corrected token  the token sampled at the first rejected slot, in place of the draft.
  bonus token      the extra token sampled at position `slots` when every draft is accepted.

Every verifier emits the accepted prefix followed by exactly one `next_token`, and the emitted
tokens are distributed exactly as if sampled from the target one at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.contracts import Proposal, SamplingParams, Verdict
from dcoco.decode.sampling import logits_to_probs, sample
from dcoco.models.cpu.row_reduce import row_argmax


def _check_block(draft_tokens: Tensor, target: Tensor, name: str) -> None:
    if draft_tokens.dim() != 2 or draft_tokens.dtype != torch.int64:
        raise ValueError(
            f"draft_tokens must be an int64 [batch, slots] tensor, got {draft_tokens.dtype} "
            f"{tuple(draft_tokens.shape)}"
        )
    batch, slots = draft_tokens.shape
    if target.dim() != 3 or target.shape[0] != batch or target.shape[1] != slots + 1:
        raise ValueError(
            f"{name} must be [batch, slots + 1, vocab] = [{batch}, {slots + 1}, vocab] for "
            f"draft_tokens of shape {tuple(draft_tokens.shape)}, got {tuple(target.shape)}"
        )


def verify_greedy(draft_tokens: Tensor, target_logits: Tensor) -> Verdict:
    """Accept drafts while they equal the target argmax; then emit the target argmax."""
    _check_block(draft_tokens, target_logits, "target_logits")
    slots = draft_tokens.shape[1]
    target_tokens = row_argmax(target_logits)  # [batch, slots + 1], = argmax(dim=-1)
    matches = draft_tokens == target_tokens[:, :slots]  # [batch, slots]
    # cumprod zeroes every slot after the first mismatch, so the sum is the accepted prefix.
    accepted = matches.long().cumprod(dim=1)  # [batch, slots]
    num_accepted = accepted.sum(dim=1)  # [batch]
    next_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)  # [batch]
    return Verdict(num_accepted=num_accepted, next_token=next_token)


def _settle(
    draft_tokens: Tensor,
    draft_mass: Tensor,
    residual: Tensor,
    target_probs: Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Shared accept/reject step once the caller has worked out the proposal's side.

    draft_mass [batch, slots]: the proposal's probability of each draft token (1 for a point mass).
    residual [batch, slots, vocab]: unnormalised distribution of the corrected token per slot.
    """
    batch, slots = draft_tokens.shape
    target_draft_mass = target_probs[:, :slots].gather(-1, draft_tokens[..., None]).squeeze(-1)
    uniforms = torch.rand(
        batch, slots, generator=generator, device=target_probs.device
    )  # [batch, slots]
    # u < target/draft written without the division, so a zero draft mass cannot give NaN.
    hits = uniforms * draft_mass < target_draft_mass  # [batch, slots]
    accepted = hits.long().cumprod(dim=1)  # [batch, slots]
    num_accepted = accepted.sum(dim=1)  # [batch]

    # Row `slots` of the candidates is the bonus distribution, so one gather serves both cases.
    candidates = torch.cat([residual, target_probs[:, slots:]], dim=1)  # [batch, slots + 1, vocab]
    index = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])  # [batch, 1, vocab]
    chosen = candidates.gather(1, index).squeeze(1)  # [batch, vocab]
    # A residual can round to all zeros when the two distributions (nearly) coincide; the target
    # itself is then the right distribution to fall back on.
    fallback = target_probs.gather(1, index).squeeze(1)  # [batch, vocab]
    chosen_mass = chosen.sum(dim=-1, keepdim=True)  # [batch, 1]
    chosen = torch.where(chosen_mass > 0, chosen / chosen_mass.clamp_min(1e-30), fallback)
    next_token = sample(chosen, generator)  # [batch]
    return Verdict(num_accepted=num_accepted, next_token=next_token)


def residual_probs(
    target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None = None
) -> Tensor:
    """max(p - q, 0) at each draft position, unnormalised: the law of the token that replaces a
    rejected draft. target_probs (p) and draft_probs (q) [..., vocab], draft_tokens [...]; without
    draft_probs q is the draft token's point mass, so the residual is p without that token."""
    if draft_probs is None:
        return target_probs.scatter(-1, draft_tokens[..., None], 0.0)
    return (target_probs - draft_probs).clamp_min(0.0)


def verify_point_mass(
    draft_tokens: Tensor, target_probs: Tensor, generator: torch.Generator | None = None
) -> Verdict:
    """Verify a deterministic proposal: each draft token was proposed with probability 1."""
    _check_block(draft_tokens, target_probs, "target_probs")
    slots = draft_tokens.shape[1]
    draft_mass = torch.ones(draft_tokens.shape, device=target_probs.device)  # [batch, slots]
    residual = residual_probs(target_probs[:, :slots], draft_tokens)
    return _settle(draft_tokens, draft_mass, residual, target_probs, generator)


def verify_with_draft_probs(
    draft_tokens: Tensor,
    draft_probs: Tensor,
    target_probs: Tensor,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Standard speculative sampling for drafts sampled from `draft_probs`."""
    _check_block(draft_tokens, target_probs, "target_probs")
    batch, slots = draft_tokens.shape
    expected = (batch, slots, target_probs.shape[-1])
    if tuple(draft_probs.shape) != expected:
        raise ValueError(
            f"draft_probs must be [batch, slots, vocab] = {list(expected)}, "
            f"got {tuple(draft_probs.shape)}"
        )
    draft_probs = draft_probs.float()
    draft_mass = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)  # [batch, slots]
    residual = residual_probs(target_probs[:, :slots], draft_tokens, draft_probs)
    return _settle(draft_tokens, draft_mass, residual, target_probs, generator)


def verify(
    proposal: Proposal,
    target_logits: Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Pick the verifier for `params` and the kind of proposal; slots == 0 is plain decoding."""
    _check_block(proposal.draft_tokens, target_logits, "target_logits")
    if params.greedy:
        # Under greedy decoding the target is a point mass, so the proposal's q is irrelevant.
        return verify_greedy(proposal.draft_tokens, target_logits)
    target_probs = logits_to_probs(target_logits, params)  # [batch, slots + 1, vocab]
    if proposal.draft_probs is None:
        return verify_point_mass(proposal.draft_tokens, target_probs, generator)
    return verify_with_draft_probs(
        proposal.draft_tokens, proposal.draft_probs, target_probs, generator
    )
