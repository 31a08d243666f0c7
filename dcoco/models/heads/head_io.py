"""Checkpoints of a drafter with a draft head: the drafter's DFlash directory, plus the head.

The head's weights sit in the same model.safetensors under `head.`, its config in config.json under
`dcoco_head` (`kind` + the head's config fields), and `architectures` names the head's architecture
(dcoco.models.drafter.drafter_io.HEAD_ARCHITECTURES) so vLLM with our plugin builds the corrected
drafter. Loaders that only know DFlash read the drafter part unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_io import (
    CONFIG_FILE,
    HEAD_ARCHITECTURES,
    HEAD_PREFIX,
    WEIGHTS_FILE,
    load_weights_strict,
    read_drafter_config,
    read_weights,
    save_drafter,
)
from dcoco.models.heads.base import head_config_dict
from dcoco.models.heads.head_registry import build_head

HEAD_KEY = "dcoco_head"
# The corrector's selection rule for a server (dcoco.models.heads.selection): a decoding choice, so
# never in a trained checkpoint's config, only in the view `dcoco serve` hands to vLLM.
SELECTION_KEY = "dcoco_selection"


def save_with_head(
    path: str | Path,
    drafter: BlockDrafter,
    head: nn.Module,
    target_info,
    dtype: torch.dtype = torch.bfloat16,
    extra: dict | None = None,
) -> Path:
    """Write drafter + head to directory `path`; `extra` goes under config.json's `dcoco`."""
    path = save_drafter(path, drafter, target_info, dtype, extra)
    weights = {
        name: tensor.detach().to(dtype).contiguous()
        for name, tensor in drafter.state_dict().items()
    }
    for name, tensor in head.state_dict().items():
        # integer buffers (a corrector's pair-count codes) keep their dtype
        cast = tensor.to(dtype) if tensor.is_floating_point() else tensor
        weights[HEAD_PREFIX + name] = cast.detach().contiguous()
    save_file(weights, path / WEIGHTS_FILE, metadata={"format": "pt"})
    hf = json.loads((path / CONFIG_FILE).read_text())
    hf["architectures"] = [HEAD_ARCHITECTURES[head.kind]]
    hf[HEAD_KEY] = head_config_dict(head)
    (path / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
    return path


def head_kind_of(path: str | Path) -> str | None:
    """The head kind stored in checkpoint `path`, or None for a plain drafter."""
    _, hf = read_drafter_config(path)
    head = hf.get(HEAD_KEY)
    return head.get("kind") if isinstance(head, dict) else None


def load_head(
    path: str | Path, target, drafter: BlockDrafter, dtype: torch.dtype | None = None
) -> nn.Module:
    """The draft head stored in `path`, built for `drafter` (loaded from the same path)."""
    path = Path(path)
    config, hf = read_drafter_config(path)
    fields = hf.get(HEAD_KEY)
    if not isinstance(fields, dict) or "kind" not in fields:
        raise DcocoError(f"{path} holds a plain drafter, no draft head ({HEAD_KEY} missing)")
    fields = dict(fields)
    kind = fields.pop("kind")
    head = build_head(kind, fields, target.embed_tokens)
    if getattr(head.config, "hidden_size", config.hidden_size) != config.hidden_size:
        raise DcocoError(f"{path}: the {kind} head does not fit its drafter's hidden size")
    weights = read_weights(path, config, hf, target)
    head_weights = {
        name[len(HEAD_PREFIX) :]: tensor
        for name, tensor in weights.items()
        if name.startswith(HEAD_PREFIX)
    }
    load_weights_strict(head, head_weights, path / WEIGHTS_FILE)
    return head.to(device=target.device, dtype=dtype or target.dtype).eval()


def continue_head(head: nn.Module, path: str | Path) -> bool:
    """Start `head` from the head stored in checkpoint `path` when that is the same kind (a run
    that trains on from a shipped head); returns whether it did. The stored head's config must
    equal `head`'s: a different shape or option is one clear error, never a silent fresh start."""
    path = Path(path)
    _, hf = read_drafter_config(path)
    stored = dict(hf.get(HEAD_KEY) or {})
    if stored.pop("kind", None) != head.kind:
        return False
    ours = head_config_dict(head)
    ours.pop("kind")
    differ = [f"{k}: {stored.get(k)!r} there, {v!r} here" for k, v in ours.items()
              if stored.get(k) != (list(v) if isinstance(v, tuple) else v)]  # fmt: skip
    if differ:
        raise DcocoError(
            f"{path} holds a {head.kind} head with other settings ({'; '.join(differ[:3])}): "
            "pass the flags it was trained with, or start from its drafter alone"
        )
    with safe_open(path / WEIGHTS_FILE, "pt") as weights:
        state = {
            name[len(HEAD_PREFIX) :]: weights.get_tensor(name)
            for name in weights.keys()
            if name.startswith(HEAD_PREFIX)
        }
    # trained in fp32; integer tables (the pair counts' codes) stay as they are
    state = {k: t.float() if t.is_floating_point() else t for k, t in state.items()}
    load_weights_strict(head, state, path / WEIGHTS_FILE)
    return True
