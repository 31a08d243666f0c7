"""The matmul kernel of the target's linear layers on CPU: aten's default or oneDNN with prepacked
weights. It changes how the forward runs, not what it computes (at bf16 the two gave bit-equal
outputs on every SmolLM2 shape, see the test).

A decoding step reads every weight once for a handful of rows, so it is bound by how fast the
kernel streams weights. aten's `F.linear` hands oneDNN (bf16) or MKL (fp32) a plain row-major
weight and lets it lay the weight out on every call; `mkldnn._reorder_linear_weight` does that once
at load, and `mkldnn._linear_pointwise` then streams the blocked copy. Measured on 2 cores of an
AMD EPYC (Zen 4, AVX-512 with bf16), SmolLM2-135M, `measure_forward` after a 300-token context:

| precision | kernel | 1 token | 8 tokens | 16 tokens |
|---|---|--:|--:|--:|
| bf16 | aten | 41-43 ms | 44-46 ms | 53-56 ms |
| bf16 | onednn | 34.5 ms | 33.6-33.9 ms | 41.4-41.8 ms |
| fp32 | aten | 62.1 ms | 88.6 ms | 97.8 ms |
| fp32 | onednn | 44.4 ms | 64.8 ms | 73.9 ms |

The prepacked op has no backward, so training keeps aten (`load_target`'s default) and decoding
picks oneDNN (`--matmul auto`) where the CPU build has it.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.cpu.cpu_info import CPUINFO, cpu_info
from dcoco.models.target.precision import replace_linears

MATMULS = ("auto", "aten", "onednn")
PACKABLE = (torch.float32, torch.bfloat16)  # the dtypes oneDNN's prepacked linear takes
# The row count the layout is tuned for. Decoding runs 1-16 rows; measured on the 1536x576 and
# 49152x576 weights, a layout for 8 rows is as fast at 1 row as one for 1 row, while at fp32 a
# layout for 1 row costs 1.7x at 8 rows (bf16 barely cares).
PACK_ROWS = 8


@functools.cache  # the CPU does not change; asked on every attention call
def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 bf16, AMX); AVX2-only CPUs emulate it."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def amx_bf16(cpuinfo: str = CPUINFO) -> bool:
    """Whether this CPU multiplies bf16 on AMX tiles (Intel Xeon since Sapphire Rapids), as the
    kernel's flags in `cpuinfo` say (False where there is none to read: not Linux)."""
    return "amx_bf16" in cpu_info(cpuinfo).flags


def onednn_available(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available() or dtype not in PACKABLE:
        return False
    return dtype != torch.bfloat16 or native_bf16()


def resolve_matmul(name: str, precision: str, dtype: torch.dtype, device: torch.device) -> str:
    """`auto`: oneDNN on a CPU whose torch build has it for this dtype, aten otherwise (CUDA, int8,
    which has its own kernel, fp16)."""
    if name not in MATMULS:
        raise DcocoError(f"unknown matmul '{name}': choose one of {', '.join(MATMULS)}")
    usable = device.type == "cpu" and precision != "int8" and onednn_available(dtype)
    if name == "auto":
        return "onednn" if usable else "aten"
    if name == "onednn" and not usable:
        raise DcocoError(
            f"matmul onednn needs a CPU target at fp32 or bf16 with a oneDNN build of torch "
            f"(got {precision} on {device.type}); use --matmul aten"
        )
    return name


class PackedLinear(nn.Module):
    """y = x W^T + b through oneDNN, W laid out once for small row counts (inference only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach()  # [out, in]
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
        self.register_buffer("weight_packed", packed)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:  # [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features)
        weight, bias = self.weight_packed, self.bias
        out = torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` in place; a tied LM head gets its own packed copy (the
    embedding keeps its rows for the lookup)."""
    return replace_linears(model, PackedLinear)
