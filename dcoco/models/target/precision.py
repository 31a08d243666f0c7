"""Target precisions and attention kernels: how the target's forward runs, not what it computes.

- `fp32`, `bf16`, `fp16`: the checkpoint's weights cast to that dtype.
- `int8`: every linear layer (the untied LM head included) keeps int8 weights with one fp scale
  per output row, and bf16 activations (`torch._weight_int8pack_mm`). This is a *different target*
  (its logits differ from bf16's), so every report names the precision and a speedup compares it
  with plain decoding at the same precision. Weight-only quantisation rounds no activation, so a row
  of a k-token verify equals the same token's 1-token step (a dynamic int8 scheme scales by the
  whole batch and would not).

Measured on 2 cores of an AMD EPYC (Zen 4, AVX-512 with bf16), SmolLM2-135M, 3 chat prompts of
`dcoco compare`: a decoding step is memory-bound, so halving the weight bytes takes it from 42 ms
(bf16) to 25 ms (int8). Row-wise determinism needs the attention too: SDPA blocks differently for
1 and k queries, and eager's bf16 matmuls did on an Intel Xeon with AMX at short contexts, so
`auto` takes the `rowwise` kernel on CPU (dcoco.models.target.rowwise_attention).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dcoco.errors import DcocoError

LOAD_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
# the same dtypes as Hugging Face configs and vLLM's --dtype spell them
HF_DTYPE_NAMES = {name: str(dtype).removeprefix("torch.") for name, dtype in LOAD_DTYPES.items()}
# the target's GGUF codes: with bf16 activations (dcoco.models.target.gguf_weights) or with its
# steps' and verifies' rows rounded to int8 per 32 inputs, as llama.cpp runs them
# (dcoco.models.target.int4_dot)
GGUF_PRECISIONS = ("gguf", "gguf-a8")
PRECISIONS = (*LOAD_DTYPES, "int8", *GGUF_PRECISIONS)
WEIGHT_FORMATS = ("int8", *GGUF_PRECISIONS)  # our weight-only formats, which transformers lacks
ATTENTIONS = ("auto", "eager", "sdpa", "rowwise")  # rowwise: dcoco.models.target.rowwise_attention


def check_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise DcocoError(f"unknown dtype '{name}': choose one of {', '.join(PRECISIONS)}")
    return name


def load_dtype(precision: str) -> torch.dtype:
    """The dtype the checkpoint is loaded in: int8 quantises from bf16, and the gguf precisions run
    their codes with bf16 activations (gguf-a8 rounds a step's to int8 inside its products)."""
    return LOAD_DTYPES.get(check_precision(precision), torch.bfloat16)


def resolve_attention(name: str, precision: str, device: torch.device | None = None) -> str:
    """`auto`: `rowwise` on a CPU (every verify row computed as the 1-token step computes it,
    dcoco.models.target.rowwise_attention), SDPA on CUDA."""
    if name not in ATTENTIONS:
        raise DcocoError(f"unknown attention '{name}': choose one of {', '.join(ATTENTIONS)}")
    if name == "auto":
        return "sdpa" if device is not None and device.type == "cuda" else "rowwise"
    return name


class Int8WeightLinear(nn.Module):
    """y = x @ (W_int8 * scale)^T + b, with W quantised symmetrically per output row."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [out]
        quantised = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", quantised)
        self.register_buffer("scale", scale.to(torch.bfloat16))
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:  # [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch._weight_int8pack_mm(rows, self.weight_int8, self.scale)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def quantise_int8_weights(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` in place (a tied LM head is untied: the embedding keeps
    its bf16 rows for the lookup)."""
    if next(model.parameters()).device.type != "cpu":
        raise DcocoError("dtype int8 is a CPU precision (torch._weight_int8pack_mm); use bf16")
    return replace_linears(model, Int8WeightLinear)


def replace_linears(model: nn.Module, make) -> nn.Module:
    """Swap every nn.Linear of `model` in place for `make(linear)`."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, make(child))
    return model
