"""A warm start for a fresh drafter from its own target (`train-drafter --init-from-target`).

Draft layer i becomes a copy of target layer L - n + i (the last n layers), `fc` reads only the
deepest tap, and the final norm is the target's. The drafter then starts where the target's last
layers would stand over the context's deepest features: its context keys/values are what those
layers see of earlier positions. Attention q/k norms, which Llama-style targets lack, start as
the identity. Shapes match by construction (DrafterConfig.for_target copies the target's).
"""

from __future__ import annotations

import torch

from dcoco.errors import DcocoError


@torch.no_grad()
def warm_start_from_target(drafter, target) -> None:
    layers = target.layers
    first = len(layers) - len(drafter.layers)
    if first < 0:
        raise DcocoError("--init-from-target needs a target with at least as many layers")
    for i, draft_layer in enumerate(drafter.layers):
        source = dict(layers[first + i].named_parameters())
        # HF Llama/Qwen3 layers use our names; q_norm/k_norm exist only in Qwen3-style targets.
        for name, param in draft_layer.named_parameters():
            if name in source:
                param.copy_(source[name].float())
    hidden = drafter.config.hidden_size
    drafter.fc.weight.zero_()
    # The deepest tap is the last slice of the concatenated taps.
    drafter.fc.weight[:, -hidden:] = torch.eye(hidden)
    drafter.hidden_norm.weight.copy_(layers[first].input_layernorm.weight.float())
    drafter.norm.weight.copy_(target.model.model.norm.weight.float())
