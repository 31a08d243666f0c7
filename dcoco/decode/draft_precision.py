"""The drafter's precision (`--draft-dtype`): the target's, fp32 beside a half-precision target,
int4 groups, or int4 groups over int8 activations (w4a8); and the rows a draft pass runs
(`--draft-block`).

A drafter shares the target's embedding and LM head and by default runs in the target's dtype. On
a CPU without native bf16 (AVX2 only) every bf16 product is emulated: the drafter's pass, most of
it the 49,152-row head over the drafted slots, took 12-33 ms at bf16 against 10-12 ms at fp32
with oneDNN's prepacked weights (`dcoco profile`, 1-7 slots, Zen 3, 2 cores), beside a 34 ms gguf
step. Its int4 groups over int8 rows (w4a8, below) need no bf16 products: in AVX2 (int4_dot_avx2.h)
a draft of 1-7 slots took 1.2-2.2 ms against fp32's 4.3-5.6 ms (2.5-3.6x; a Zen 4 EPYC with
torch, oneDNN and the kernels held to AVX2, `scripts/reproduce/w4a8_cost.py --draft-baseline
fp32`, docs/lab/results.md). So `auto` is w4a8 there where the kernel builds, else the drafter, its
draft head and a private fp32 copy of the LM head (113 MB for SmolLM2) run in fp32.

On a CPU with native bf16 but no AMX (AVX-512 bf16: AMD Zen 4) the pass streams its weights faster
as int4 groups (dcoco.models.target.int4_groups) on the CPU's int4 kernel: 2-core EPYC, SmolLM2's
drafter, 3 drafts over the drafted slots, 3.1 ms in bf16 against 2.1 ms in int4
(scripts/reproduce/draft_pass_cost.py). So `auto` is int4 there, for drafters whose layers the
kernel takes (every input width a multiple of 32). Where the CPU also has AVX-512 VNNI and the fused
kernels build, `auto` is w4a8 (dcoco.models.target.int4_dot: the same int4 weights, the few rows of
a draft rounded to int8 per 32 inputs and summed in int32, as llama.cpp does): 4 drafts 2.05 -> 1.61
ms and 7 drafts 3.34 -> 2.30 ms on that EPYC, τ unchanged (scripts/reproduce/w4a8_cost.py,
docs/lab/results.md). Elsewhere (AMX, where bf16 products run on tiles; CUDA) it is the target's
dtype. Drafts are proposals: the target still verifies every token, so the output is the same; only
which tokens get proposed may change, as between any two precisions (τ at 4 and 7 drafts moved by
0.01-0.02 between bf16 and int4, docs/lab/results.md).

This module's `auto` is the rule by CPU kind; `--draft-dtype auto` itself measures the settings
that run here and keeps the fastest (dcoco.decode.auto_draft), as a Xeon with AMX may draft faster
in w4a8 on its AVX-512 VNNI than in bf16 on its tiles.

`--draft-block drafted` (the default) runs the anchor and the slots this cycle drafts, not the
whole block, as vLLM runs DFlash when it drafts fewer tokens than the block holds; the slots see
fewer masks after them than in training (τ 2.33 -> 2.31 at 4 drafts, same place).
"""

from __future__ import annotations

import torch
from torch import nn

from dcoco.errors import DcocoError
from dcoco.models.drafter.draft_pass import DraftPass, Product, dense_product
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.target.gguf_weights import GROUP, int4_packable
from dcoco.models.target.head_precision import Fp32Head, head_copy
from dcoco.models.target.int4_dot import int4_dot_available, require_int4_dot, w4a8_linear
from dcoco.models.target.int4_groups import int4_linear
from dcoco.models.target.packed_linear import amx_bf16, native_bf16, onednn_available, pack_linears
from dcoco.models.target.target import TargetModel

DRAFT_DTYPES = ("auto", "target", "fp32", "int4", "w4a8")
QUANTISED = {"int4": int4_linear, "w4a8": w4a8_linear}  # setting -> the product of its layers
HALF = (torch.bfloat16, torch.float16)
PLAIN_HEADS = (nn.Linear, Fp32Head)  # heads whose weights an fp32 drafter can run on


DRAFT_BLOCKS = ("drafted", "full")


def check_draft_block(name: str) -> str:
    if name not in DRAFT_BLOCKS:
        raise DcocoError(f"unknown draft block '{name}': choose one of {', '.join(DRAFT_BLOCKS)}")
    return name


def check_draft_dtype(name: str) -> str:
    if name not in DRAFT_DTYPES:
        raise DcocoError(f"unknown draft dtype '{name}': choose one of {', '.join(DRAFT_DTYPES)}")
    return name


def draft_setting(name: str, target: TargetModel) -> str:
    """What the setting `name` runs beside `target`: `target`, `fp32`, `int4` or `w4a8` (`auto`
    resolved from the machine, see the module doc)."""
    if check_draft_dtype(name) != "auto":
        return name
    if target.device.type != "cpu" or target.dtype not in HALF:
        return "target"
    if not native_bf16():
        if int4_dot_available():
            return "w4a8"
        return "fp32" if isinstance(target.lm_head, PLAIN_HEADS) else "target"
    if amx_bf16():
        return "target"
    return "w4a8" if int4_dot_available() else "int4"


def draft_dtype(name: str, target: TargetModel) -> torch.dtype:
    """The drafter's dtype for `target` under the setting `name` (int4: the dtype its products
    take and give, the target's)."""
    setting = draft_setting(name, target)
    if setting != "fp32":
        return target.dtype
    if not isinstance(target.lm_head, PLAIN_HEADS):
        raise DcocoError(
            f"--draft-dtype fp32 needs the target's LM head as plain weights (its precision "
            f"{target.precision} keeps it otherwise); use --draft-dtype target"
        )
    return torch.float32


def load_proposer_drafter(path, target: TargetModel, name: str) -> BlockDrafter:
    """The drafter in `path` at the dtype `name` resolves to, with an LM head copy of its own
    where that differs from the target's dtype (an fp32 drafter shares the target's fp32 head,
    dcoco.models.target.head_precision). Its linear layers are not packed yet (a draft head may read
    them first: pack_drafter)."""
    dtype = draft_dtype(name, target)
    if dtype == target.dtype:
        return load_drafter(path, target)
    if dtype == torch.float32 and isinstance(target.lm_head, Fp32Head):
        return load_drafter(path, target, dtype, target.lm_head)
    return load_drafter(path, target, dtype, head_copy(target.lm_head, dtype))


def drafter_product(name: str, target: TargetModel, config: DrafterConfig) -> Product | None:
    """The product the setting `name` runs the drafter's layers and draft head on (of `config`):
    int4 groups (dcoco.models.target.int4_groups) or w4a8 (dcoco.models.target.int4_dot), CPU
    targets only and widths the int4 kernels pack (`auto` falls back to the target's dtype for
    others; a named setting fails clearly); None where the layers keep their dtype."""
    setting = draft_setting(name, target)
    if setting not in QUANTISED:
        return None
    if target.device.type != "cpu":
        raise DcocoError(f"--draft-dtype {setting} runs on the CPU's int4 kernels: use it on a CPU")
    if setting == "w4a8":
        require_int4_dot("--draft-dtype w4a8", "--draft-dtype int4")
    if quantised_widths_fit(config):
        return QUANTISED[setting]
    if name == "auto":
        return None
    widths = _input_widths(config)
    raise DcocoError(f"--draft-dtype {setting} needs the drafter's input widths {widths} "
                     f"divisible by {GROUP}; use --draft-dtype target")  # fmt: skip


def quantised_widths_fit(config: DrafterConfig) -> bool:
    """Whether the int4 kernels pack the drafter's layers: every input width a multiple of 32."""
    return all(int4_packable(width) for width in _input_widths(config))


def _input_widths(config: DrafterConfig) -> tuple[int, ...]:
    return config.hidden_size, config.intermediate_size, config.num_taps * config.hidden_size


def pack_drafter(drafter: BlockDrafter, target: TargetModel,
                 product: Product | None = None) -> BlockDrafter:  # fmt: skip
    """The drafter's decoding pass (dcoco.models.drafter.draft_pass) from its weights: `product`'s
    layers (drafter_product), else its dtype's, on oneDNN's prepacked kernel where the target's are,
    or where the drafter runs apart from the target in a dtype oneDNN takes (the draft heads keep
    reading the module's weights, which stay as they are)."""
    draft_pass = DraftPass(drafter, product or dense_product)
    apart = drafter.dtype != target.dtype and target.device.type == "cpu"
    if target.matmul == "onednn" or (apart and onednn_available(drafter.dtype)):
        pack_linears(draft_pass)  # int4 layers: their dense copy for prefills
    drafter.use_draft_pass(draft_pass)
    return drafter
