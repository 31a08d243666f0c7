"""The LM head's precision (`--head-dtype`): the target's, or fp32 on oneDNN's prepacked kernel.

On a CPU that emulates bf16 (AVX2 only) a half-precision head is cheap for the one row of a
decoding step and dear for the k + 1 rows of a verify: the 49,152 x 576 head of SmolLM2 took
4.66 / 11.76 / 16.62 / 31.90 ms for 1 / 2 / 4 / 8 rows at bf16 (aten), against 7.43 / 9.71 /
11.02 / 11.88 ms in fp32 with prepacked weights (`scripts/reproduce/head_kernels.py`, AMD EPYC
Zen 3, 2 threads, one run). Which one a run should take depends on how many rows its method
verifies, so `--head-dtype auto` is measured with the precision (dcoco.decode.auto_precision).

The fp32 head computes every row of a k-row product as it computes that row alone (oneDNN's fp32
kernel, as the fp32 precision's layers), so a verify still rounds like the step it replaces. Its
logits are fp32 and its weights an fp32 copy of the head's (113 MB for SmolLM2; the embedding
keeps its rows for the lookup); a drafter running in fp32 beside it shares that copy.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.target.packed_linear import PackedLinear, native_bf16, onednn_available

HEAD_DTYPES = ("auto", "target", "fp32")
HALF_PRECISIONS = ("bf16", "fp16", "gguf", "gguf-a8")  # gguf's head: its dequantised Q8_0, bf16


def check_head_dtype(name: str) -> str:
    if name not in HEAD_DTYPES:
        raise DcocoError(f"unknown head dtype '{name}': choose one of {', '.join(HEAD_DTYPES)}")
    return name


def fp32_head_pays(precision: str, device: torch.device) -> bool:
    """Whether `auto` weighs an fp32 head for `precision` on `device`: a half-precision target
    on a CPU that emulates bf16 (elsewhere the target's own head is at least as fast)."""
    return device.type == "cpu" and precision in HALF_PRECISIONS and not native_bf16()


def head_copy(head: nn.Linear, dtype: torch.dtype) -> nn.Module:
    """A copy of the LM head `head` in `dtype`, on oneDNN's prepacked kernel where it has one."""
    shape = dict(bias=head.bias is not None, device="meta", dtype=dtype)  # no random init
    copy = nn.Linear(head.in_features, head.out_features, **shape)
    copy = copy.to_empty(device=head.weight.device).requires_grad_(False)
    copy.weight.copy_(head.weight.detach())
    if head.bias is not None:
        copy.bias.copy_(head.bias.detach())
    usable = head.weight.device.type == "cpu" and onednn_available(dtype)
    return PackedLinear(copy) if usable else copy


class Fp32Head(nn.Module):
    """logits = x Wᵀ (+ b) in fp32, x upcast, over an fp32 copy of a plain LM head."""

    def __init__(self, head: nn.Linear):
        super().__init__()
        self.linear = head_copy(head, torch.float32)
        self.in_features, self.out_features = head.in_features, head.out_features

    def forward(self, x: Tensor) -> Tensor:  # [..., in] -> [..., out] fp32
        return self.linear(x.float())


def install_head(model: nn.Module, head_dtype: str) -> None:
    """Give `model` (a Hugging Face causal LM) the head `head_dtype` (`target` or `fp32`)."""
    if check_head_dtype(head_dtype) == "auto":
        raise DcocoError("--head-dtype auto is resolved before the target loads")
    head = model.get_output_embeddings()
    if head_dtype == "target":
        return
    if type(head) is not nn.Linear:
        raise DcocoError(
            f"--head-dtype fp32 needs the LM head as plain weights ({type(head).__name__} keeps "
            f"them otherwise); use --head-dtype target"
        )
    if head.weight.dtype != torch.float32:  # an fp32 target's head is fp32 already
        model.set_output_embeddings(Fp32Head(head))
