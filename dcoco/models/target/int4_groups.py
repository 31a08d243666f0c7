"""Our own int4 quantisation, for the drafter's weights (`--draft-dtype int4`): 4-bit codes with a
scale and a zero point per 32 inputs, in the convention of gguf's int4 layers
(dcoco.models.target.gguf_weights.Int4GroupLinear: w = (q - 8)·scale + zero), so they run on the
same CPU kernel.

Each group maps its [min, max] onto the codes 0..15 (asymmetric, round to nearest). A drafter's
weights only propose tokens: the target verifies every one, so a quantised drafter changes which
tokens get proposed, never the output.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.models.target.gguf_weights import GROUP, Int4GroupLinear

LEVELS = 15  # the largest 4-bit code


def quantise_int4(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """weight [out, in] (in divisible by 32) -> codes [out, in] int32 in 0..15 and the kernel's
    scale and zero [out, in / 32] fp32, with dequantise(codes, scale, zero) ≈ weight."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # [out, groups]
    # a constant group keeps scale 1: every code dequantises to its one value exactly
    scale = torch.where(high > low, (high - low) / LEVELS, torch.ones_like(low))
    codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, LEVELS)
    return codes.reshape(out_features, in_features).to(torch.int32), scale, low + 8 * scale


def int4_linear(weight: Tensor) -> Int4GroupLinear:
    """A bias-free Int4GroupLinear holding `weight` [out, in] quantised (quantise_int4)."""
    return Int4GroupLinear(*quantise_int4(weight))
