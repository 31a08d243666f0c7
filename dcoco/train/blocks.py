"""Pure helpers that turn one tokenised sequence into DFlash training blocks.

Training mirrors inference exactly: a block `[x_a, MASK x (B-1)]` at positions `a .. a+B-1` sees
the target features of positions `< a` only (at inference the anchor's own feature does not exist
yet), sees its own block bidirectionally, and no other block. Slot k is labelled with the token at
its own position, `x[a + k]`; slot 0 (the anchor) carries no loss.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dcoco.contracts import IGNORE


def sample_anchors(
    loss_mask: Tensor,  # [tokens] bool: True on response tokens
    num_anchors: int,
    block_size: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Up to `num_anchors` distinct sorted anchor positions [n] at response tokens, each with a
    full block inside the sequence (anchor + block_size <= tokens)."""
    usable = loss_mask.clone()
    usable[max(loss_mask.shape[0] - block_size + 1, 0) :] = False
    candidates = usable.nonzero().flatten()
    if candidates.numel() <= num_anchors:
        return candidates
    pick = torch.randperm(candidates.numel(), generator=generator)[:num_anchors]
    return candidates[pick.to(candidates.device)].sort().values


def strided_anchors(
    loss_mask: Tensor,  # [tokens] bool: True on response tokens
    stride: int,
    offset: int,
    block_size: int,
) -> Tensor:
    """Dense anchors: every `stride`-th usable response position, starting `offset` (mod
    `stride`) into the response, as a sorted [n]. Shifting `offset` by one each epoch makes every
    reply position an anchor once every `stride` epochs. Blocks may overlap; the block mask keeps
    each one blind to the others."""
    usable = loss_mask.clone()
    usable[max(loss_mask.shape[0] - block_size + 1, 0) :] = False
    candidates = usable.nonzero().flatten()
    if candidates.numel() == 0:
        return candidates
    return candidates[(candidates - candidates[0] - offset) % stride == 0]


def block_inputs_and_labels(
    input_ids: Tensor,  # [batch, tokens]
    anchors: Tensor,  # [batch, n]
    block_size: int,
    mask_token_id: int,
    hint_ids: Tensor | None = None,  # [batch, n, block - 1] copy hints, < 0 = none
) -> tuple[Tensor, Tensor, Tensor]:
    """Block ids, positions and same-position labels, each [batch, n * block].

    Block j is `[x[a_j], MASK, ...]` at positions `a_j + 0 .. a_j + B-1` (a slot with a copy
    hint holds the hint instead of MASK); slot k is labelled `x[a_j + k]` (k >= 1) and slot 0 is
    IGNORE, as is any slot past the end of the sequence.
    """
    offsets = torch.arange(block_size, device=anchors.device)
    positions = anchors[..., None] + offsets  # [batch, n, block]
    inside = positions < input_ids.shape[1]
    gathered = input_ids.gather(1, positions.clamp(max=input_ids.shape[1] - 1).flatten(1))
    labels = gathered.view_as(positions).masked_fill(~inside, IGNORE)
    labels[..., 0] = IGNORE
    block_ids = torch.full_like(positions, mask_token_id)
    block_ids[..., 0] = input_ids.gather(1, anchors)
    if hint_ids is not None:
        block_ids[..., 1:] = torch.where(hint_ids >= 0, hint_ids, block_ids[..., 1:])
    return block_ids.flatten(1), positions.flatten(1), labels.flatten(1)


def block_attention_mask(
    anchors: Tensor,  # [batch, n]
    seq_len: int,
    block_size: int,
    context_valid: Tensor | None = None,  # [batch, tokens] bool, False on padding
    window: int = 0,
) -> Tensor:
    """Bool mask [batch, 1, n * block, tokens + n * block] (True = may attend).

    A query of block j sees context key i iff i < anchor_j (strictly), every key of its own block,
    and nothing of any other block. With `window` > 0 it sees only the last `window` context
    positions (anchor_j - window <= i), a training curriculum; inference sees all of them.
    """
    batch, num_blocks = anchors.shape
    device = anchors.device
    keys = torch.arange(seq_len, device=device)
    sees_context = keys[None, None, :] < anchors[..., None]  # [batch, n, tokens]
    if window > 0:
        sees_context = sees_context & (keys[None, None, :] >= anchors[..., None] - window)
    if context_valid is not None:
        sees_context = sees_context & context_valid[:, None, :]
    sees_context = sees_context.repeat_interleave(block_size, dim=1)  # [batch, n*block, tokens]
    block_of = torch.arange(num_blocks * block_size, device=device) // block_size
    same_block = block_of[:, None] == block_of[None, :]  # [n*block, n*block]
    sees_blocks = same_block.expand(batch, -1, -1)
    return torch.cat([sees_context, sees_blocks], dim=-1)[:, None]


def slot_weights(block_size: int, gamma: float) -> Tensor:
    """Loss weight per slot [block]: w_0 = 0 (the anchor), w_k = exp(-(k-1)/gamma) for k >= 1.

    Early slots matter most: a draft is only accepted up to its first miss.
    """
    weights = [0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, block_size)]
    return torch.tensor(weights)


def acceptance_stats(correct: Tensor) -> tuple[Tensor, Tensor]:
    """From `correct` [blocks, slots] bool: per-slot accuracy [slots] and the simulated
    acceptance length per block [blocks] (accepted prefix + the bonus token, in 1 .. slots+1)."""
    accepted = correct.long().cumprod(dim=1).sum(dim=1) + 1
    return correct.float().mean(dim=0), accepted.float()
