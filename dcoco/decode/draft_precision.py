"""The drafter's precision (`--draft-dtype`): the target's, or fp32 beside a half-precision target.

A drafter shares the target's embedding and LM head and by default runs in the target's dtype. On
a CPU without native bf16 (AVX2 only) every bf16 product is emulated: the drafter's pass, most of
it the 49,152-row head over the drafted slots, took 12-33 ms at bf16 against 10-12 ms at fp32
with oneDNN's prepacked weights (`dcoco profile`, 1-7 slots, Zen 3, 2 cores), beside a 34 ms gguf
step. So `auto` runs the drafter, its draft head and a private fp32 copy of the LM head (113 MB
for SmolLM2) in fp32 there, and the target's dtype everywhere else. Drafts are proposals: the
target still verifies every token, so the output is the same; only which tokens get proposed
may change, as between any two precisions.
"""

from __future__ import annotations

import torch
from torch import nn

from dcoco.errors import DcocoError
from dcoco.models.drafter import BlockDrafter
from dcoco.models.drafter_io import load_drafter
from dcoco.models.head_precision import Fp32Head, head_copy
from dcoco.models.packed_linear import native_bf16, onednn_available, pack_linears
from dcoco.models.target import TargetModel

DRAFT_DTYPES = ("auto", "target", "fp32")
HALF = (torch.bfloat16, torch.float16)
PLAIN_HEADS = (nn.Linear, Fp32Head)  # heads whose weights an fp32 drafter can run on


def check_draft_dtype(name: str) -> str:
    if name not in DRAFT_DTYPES:
        raise DcocoError(f"unknown draft dtype '{name}': choose one of {', '.join(DRAFT_DTYPES)}")
    return name


def draft_dtype(name: str, target: TargetModel) -> torch.dtype:
    """The drafter's dtype for `target` under the setting `name` (see the module doc)."""
    if check_draft_dtype(name) == "target":
        return target.dtype
    if name == "fp32":
        if not isinstance(target.lm_head, PLAIN_HEADS):
            raise DcocoError(
                f"--draft-dtype fp32 needs the target's LM head as plain weights (its precision "
                f"{target.precision} keeps it otherwise); use --draft-dtype target"
            )
        return torch.float32
    emulated = target.device.type == "cpu" and not native_bf16()
    plain_head = isinstance(target.lm_head, PLAIN_HEADS)
    return torch.float32 if emulated and plain_head and target.dtype in HALF else target.dtype


def load_proposer_drafter(path, target: TargetModel, name: str) -> BlockDrafter:
    """The drafter in `path` at the dtype `name` resolves to, with an LM head copy of its own
    where that differs from the target's dtype (an fp32 drafter shares the target's fp32 head,
    dcoco.models.head_precision). Its linear layers are not packed yet (a draft head may read
    them first: pack_drafter)."""
    dtype = draft_dtype(name, target)
    if dtype == target.dtype:
        return load_drafter(path, target)
    if dtype == torch.float32 and isinstance(target.lm_head, Fp32Head):
        return load_drafter(path, target, dtype, target.lm_head)
    return load_drafter(path, target, dtype, head_copy(target.lm_head, dtype))


def pack_drafter(drafter: BlockDrafter, target: TargetModel) -> BlockDrafter:
    """The drafter's linear layers on oneDNN's prepacked kernel where the target's are, or where
    the drafter runs apart from the target in a dtype oneDNN takes (the draft heads keep aten's,
    as they read their weights directly)."""
    apart = drafter.dtype != target.dtype and target.device.type == "cpu"
    if target.matmul == "onednn" or (apart and onednn_available(drafter.dtype)):
        pack_linears(drafter)
    return drafter
