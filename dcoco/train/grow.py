"""Growing a trained drafter by layers (`train-drafter --init D --add-layers N`).

A drafter whose training and held-out acceptance agree may be short of capacity (or only of
training: on the SmolLM2 drafter more passes beat 2 more layers on the same wall-clock,
results/smollm2-drafter-grow). Training a deeper one from scratch would repeat the whole
curriculum; instead the new layers go on top of the trained ones with their two residual
writes (attention `o_proj`, MLP `down_proj`) zeroed, so the grown drafter starts as exactly the
trained one's function and the new layers learn what the old ones could not hold. Their other
weights keep the fresh init: with a zero write the layer's input gradients vanish only for the
first step, until `o_proj`/`down_proj` move.
"""

from __future__ import annotations

import dataclasses

import torch

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter


@torch.no_grad()
def grow_drafter(drafter: BlockDrafter, add_layers: int, seed: int) -> BlockDrafter:
    """`drafter` with `add_layers` identity layers appended (a new module; shared weights kept)."""
    if add_layers < 0:
        raise DcocoError(f"--add-layers must be >= 0, not {add_layers}")
    if add_layers == 0:
        return drafter
    old = drafter.config.num_layers
    config = dataclasses.replace(drafter.config, num_layers=old + add_layers)
    torch.manual_seed(seed)
    grown = BlockDrafter(config, *drafter._shared).to(drafter.fc.weight.device)
    missing, unexpected = grown.load_state_dict(drafter.state_dict(), strict=False)
    new_prefixes = tuple(f"layers.{i}." for i in range(old, old + add_layers))
    if unexpected or not all(name.startswith(new_prefixes) for name in missing):
        raise DcocoError(f"cannot grow this drafter: {unexpected or missing} did not line up")
    for layer in grown.layers[old:]:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    return grown.to(drafter.fc.weight.dtype)
