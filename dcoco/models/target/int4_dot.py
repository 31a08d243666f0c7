"""Int4 layers whose few-row products take int8 activations: `--draft-dtype w4a8` for drafters,
dtype `gguf-a8` for the target.

torch's CPU int4 kernel turns each 4-bit weight into fp32 and multiplies it by each row in fp32:
on a 2-core Zen 4 EPYC the drafter's 16,000-row int4 head took 257 µs for one row, compute-bound,
and the kernel pays per block of 4 rows, so a draft of 5-7 slots cost half again one of 4.
llama.cpp instead rounds the activations to int8 per 32 inputs and sums byte products in int32,
64 a VNNI instruction. int4_dot.cpp does that for up to 8 rows at a time (AVX-512 VNNI; in AVX2,
int4_dot_avx2.h, 4 rows and two instructions for one: the same sums), on the same codes, scales
and zeros as an Int4GroupLinear (the weights are the same; only the rows are rounded: x ≈ a·xq
with a = max|x| / 127 per 32 inputs, and Σ x kept exact for the zero points).

For a drafter, rounding its activations changes which tokens are proposed, never the output (τ
did not move, docs/lab/results.md). For the target it is another precision, as llama.cpp's own
arithmetic is: each row is rounded and summed alone, so a verify's rows equal the steps they
replace and greedy output equals plain decoding's at gguf-a8. Prefills (more than 16 rows) take
the dequantised copy, as at gguf. It needs AVX-512 VNNI (Zen 4, Xeons since Cascade Lake) or
AVX2 with FMA and F16C (Zen 3, Haswell on), and the fused kernels built; where it is missing
`auto` keeps int4 and gguf, and naming w4a8 or gguf-a8 fails with one line.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.cpu import cpu_kernels
from dcoco.models.target.gguf_weights import GROUP, Int4GroupLinear
from dcoco.models.target.int4_groups import quantise_int4
from dcoco.models.target.rowwise_attention import MAX_ROWWISE_QUERIES

LANES = 16  # outputs per block: one AVX-512 register of int32 sums
MAX_ROWS = MAX_ROWWISE_QUERIES  # steps, verifies, drafts; prefills take the int4 layer's path


def int4_dot_available() -> bool:
    """Whether the int8-activation kernel was built here (AVX-512 VNNI or AVX2, and a
    compiler)."""
    built = cpu_kernels.kernels()
    return built is not None and built.int4_dot_available()


def int4_dot_isa() -> str:
    """The instructions the kernel runs on here: `avx512-vnni`, `avx2`, or `` (not built)."""
    built = cpu_kernels.kernels()
    return built.int4_dot_isa() if built is not None else ""


def require_int4_dot(setting: str, instead: str) -> None:
    """One error line where `setting` (a dtype naming this kernel) cannot run: use `instead`."""
    if not int4_dot_available():
        raise DcocoError(f"{setting} needs AVX-512 VNNI or AVX2 and the fused CPU kernels built "
                         f"(dcoco.models.cpu.cpu_kernels); use {instead}")  # fmt: skip


def pack(codes: Tensor, scale: Tensor, zero: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """codes [out, in] (0..15), scale and zero [out, in / 32] (w = (q - 8)·scale + zero) -> the
    kernel's weights [out / 16, in / 8, 16, 4] uint8, scales and zeros [out / 16, in / 32, 16]
    fp16; `out` padded to a multiple of 16 with zero rows."""
    out_features, in_features = codes.shape
    pad = (0, 0, 0, -out_features % LANES)
    codes = F.pad(codes.to(torch.int32), pad, value=8)  # padded rows: weights 0
    scale, zero = F.pad(scale.half(), pad), F.pad(zero.half(), pad)
    blocks, groups = codes.shape[0] // LANES, in_features // GROUP
    # [blocks, lane, in / 8, 2 (low nibbles: inputs k..k+3, high: k+4..k+7), 4]
    split = codes.to(torch.uint8).view(blocks, LANES, in_features // 8, 2, 4)
    weights = (split[:, :, :, 0] | (split[:, :, :, 1] << 4)).transpose(1, 2).contiguous()
    per_group = [t.view(blocks, LANES, groups).transpose(1, 2).contiguous() for t in (scale, zero)]
    return weights, *per_group


class Int4DotLinear(Int4GroupLinear):
    """An Int4GroupLinear whose products of up to 16 rows round the rows to int8 per 32 inputs
    and run on int4_dot.cpp; longer inputs (prefills) take its dequantised copy as before. It
    keeps no copy in torch's int4 layout: nothing here reads one."""

    def __init__(self, codes: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None = None):
        super().__init__(codes, scale, zero, bias)
        names = ("weights", "scales", "zeros")
        for name, packed in zip(names, pack(codes, scale, zero), strict=True):
            self.register_buffer(f"dot_{name}", packed)

    def _int4_pack(self, codes: Tensor) -> None:
        return None

    def forward(self, x: Tensor) -> Tensor:  # [..., in] -> [..., out] bf16
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if rows.shape[0] > MAX_ROWS:
            return super().forward(x)  # a prefill: the dequantised copy
        if rows.dtype not in (torch.bfloat16, torch.float32):
            rows = rows.float()
        out = cpu_kernels.kernels().int4_dot(rows.contiguous(), *_packed(self))
        out = out if out.shape[1] == self.out_features else out[:, : self.out_features]
        out = out if self.bias is None else out + self.bias
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)


def w4a8_linear(weight: Tensor) -> Int4DotLinear:
    """A bias-free Int4DotLinear holding `weight` [out, in] quantised (quantise_int4)."""
    return Int4DotLinear(*quantise_int4(weight))


def all_w4a8(*layers: nn.Module) -> bool:
    """Whether qkv() and mlp() run on these products: each w4a8 and bias-free."""
    return all(isinstance(layer, Int4DotLinear) and layer.bias is None for layer in layers)


def _packed(layer: Int4DotLinear) -> tuple[Tensor, Tensor, Tensor]:
    buffers = layer._buffers  # not nn.Module.__getattr__: a draft makes ten of these calls
    return buffers["dot_weights"], buffers["dot_scales"], buffers["dot_zeros"]


def qkv(hidden: Tensor, context: Tensor, norm: Tensor, eps: float, layer: Int4DotLinear,
        qk_norm: Tensor, cos: Tensor, signed_sin: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The q|k|v heads of [context; rms_norm(hidden, norm, eps)] (bf16 rows, together <= MAX_ROWS)
    in one call (w4a8_layer.cpp): (the first qk_norm.shape[0] heads normed per head by qk_norm and
    rotated by cos, signed_sin [positions, 1, dim], as layer_loop.rotate computes them; every head
    [positions, heads, dim] as the product left them). Equal to those operators."""
    return cpu_kernels.kernels().w4a8_qkv(
        hidden, context, norm, eps, *_packed(layer), layer.out_features, qk_norm, cos, signed_sin
    )


def mlp(hidden: Tensor, norm: Tensor, eps: float, gate_up: Int4DotLinear, down: Int4DotLinear,
        width: int) -> Tensor:  # fmt: skip
    """hidden [rows, n] bf16 (rows <= MAX_ROWS, contiguous) -> hidden + down(silu(gate) · up)
    with gate | up = gate_up(rms_norm(hidden, norm, eps)), `width` columns each, in one call
    (w4a8_layer.cpp): equal to those operators but where silu's exp rounds to another bf16."""
    return cpu_kernels.kernels().w4a8_mlp(
        hidden, norm, eps, *_packed(gate_up), *_packed(down), width
    )
