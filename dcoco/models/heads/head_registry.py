"""Draft heads by kind name: `dcoco` (the corrector), `dspark` and `domino` (sequential heads).

The contract they share lives in dcoco.models.heads.base; this module is the one place that knows
every head, so the heads themselves import only the contract.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from dcoco.errors import DcocoError
from dcoco.models.heads.corrector import Corrector, CorrectorConfig
from dcoco.models.heads.sequential_heads import GruHead, GruHeadConfig, MarkovHead, MarkovHeadConfig

HEADS: dict[str, tuple[type, type[nn.Module]]] = {
    "dcoco": (CorrectorConfig, Corrector),
    "dspark": (MarkovHeadConfig, MarkovHead),
    "domino": (GruHeadConfig, GruHead),
}


def head_kinds() -> tuple[str, ...]:
    return tuple(HEADS)


def head_classes(kind: str) -> tuple[type, type[nn.Module]]:
    """(config dataclass, module class) of a head kind."""
    if kind not in HEADS:
        raise DcocoError(f"unknown head kind '{kind}': choose one of {', '.join(head_kinds())}")
    return HEADS[kind]


def build_head(kind: str, fields: dict, embed_tokens: nn.Embedding) -> nn.Module:
    """A fresh head of `kind` from config `fields` (unknown fields are an error)."""
    config_class, module_class = head_classes(kind)
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise DcocoError(f"{kind} head config has unknown fields {unknown}")
    try:
        config = config_class(**fields)
    except TypeError as error:
        raise DcocoError(f"bad {kind} head config ({error})") from error
    return module_class(config, embed_tokens)
