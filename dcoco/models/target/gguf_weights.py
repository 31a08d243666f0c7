"""Precision `gguf`: the target's linear layers run on the 4-bit codes its GGUF file ships.

A batch-1 decoding step is memory-bound: it streams every weight once. The embedded SmolLM2 GGUF
stores its linear layers as Q4_1 (per 32 weights an fp16 scale d and minimum m, and 4-bit codes q:
w = d·q + m), about 0.6 bytes a weight, where the bf16 copy we dequantise to takes 2. torch's CPU
kernel `_weight_int4pack_mm_for_cpu` computes x·Wᵀ from 4-bit codes with, per group of 32 inputs,
a scale and a zero point: w = (q − 8)·scale + zero. Q4_1 maps onto it exactly with scale = d and
zero = m + 8·d; the one rounding is that the kernel takes both in bf16 (bf16 activations), where
the GGUF has fp16 (one part in 256 of a weight at most). Tensors of any other type (the Q8_0
embedding, which is also the tied LM head) keep their dequantised bf16 copy.

The kernel computes each row of a k-row product exactly as it computes that row alone (see the
tests), so a k-token verify rounds like the 1-token step it replaces. Measured on 2 cores of an
Intel Xeon (AMX, bf16), 1536x576: 23 µs for 1 row against 56 µs for bf16 `F.linear`; 79 µs for 8
rows against 60 µs, so the verify round grows faster with k than at bf16.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.target.packed_linear import native_bf16
from dcoco.models.target.rowwise_attention import MAX_ROWWISE_QUERIES
from dcoco.models.target.shared_input import SharedProduct, slices

GROUP = 32  # Q4_1's block, and the kernel's group size
INNER_K_TILES = 2  # the packing's tile depth: in_features must divide by 16 * this
Q4_1_BYTES = 20  # per block: fp16 d, fp16 m, 16 bytes of codes
# GGUF tensor kind -> the Llama-family module under model.layers.<i>
LINEAR_KINDS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# layers of one module that read the same input, in the order they are called
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def q4_1_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[Tensor, Tensor, Tensor]:
    """Split Q4_1 bytes [rows, cols / 32 * 20] into codes [rows, cols] (int32, 0..15) and the
    kernel's scale and zero [rows, cols / 32] (fp32): w = (q - 8)·scale + zero."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, cols // GROUP, Q4_1_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, groups]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = blocks[..., 4:]  # [rows, groups, 16]: byte j holds element j (low) and j + 16 (high)
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, cols)
    d_t = torch.from_numpy(d)
    return torch.from_numpy(codes.astype(np.int32)), d_t, torch.from_numpy(m) + 8 * d_t


class Int4GroupLinear(nn.Module):
    """y = x Wᵀ + b with W held as 4-bit codes and a bf16 scale and zero per 32 inputs."""

    def __init__(self, codes: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = codes.shape  # codes: [out, in]
        if not int4_packable(self.in_features):
            raise DcocoError(f"int4 packing needs in_features divisible by 32 ({codes.shape})")
        self.register_buffer("weight_int4", self._int4_pack(codes))
        # [groups, out, 2]: the kernel's layout
        scales_and_zeros = torch.stack([scale.T, zero.T], dim=-1).to(torch.bfloat16).contiguous()
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))
        self.prefill = _prefill_linear(codes, scales_and_zeros)
        self.prefill_dtype = self.prefill.weight.dtype  # packing drops the module's .weight

    def _int4_pack(self, codes: Tensor) -> Tensor | None:
        """The codes in torch's int4 kernel's layout (None where a subclass runs another)."""
        return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), INNER_K_TILES)

    def forward(self, x: Tensor) -> Tensor:  # [..., in] -> [..., out]
        if x.dim() == 2 and x.shape[0] <= MAX_ROWWISE_QUERIES and self.bias is None:
            # a step's, verify's or draft's few rows: the kernel itself (the general path's
            # reshapes and branches cost ~9 µs a call, ten calls a draft pass)
            return int4_rows(x, self.weight_int4, self.scales_and_zeros)
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > MAX_ROWWISE_QUERIES:  # a prefill: every method's, one kernel for all
            out = self.prefill(rows.to(self.prefill_dtype)).to(torch.bfloat16)
        else:  # steps and verifies: the int4 kernel, which computes every row alike
            out = int4_rows(rows, self.weight_int4, self.scales_and_zeros)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def int4_packable(in_features: int) -> bool:
    """Whether the kernel packs a layer of this input width (whole tiles and groups)."""
    return in_features % (16 * INNER_K_TILES) == 0 and in_features % GROUP == 0


def _prefill_linear(codes: Tensor, scales_and_zeros: Tensor) -> nn.Linear:
    """The layer's weights dequantised from the kernel's own codes, scales and zeros, for inputs
    longer than a verify. The int4 kernel dequantises its weights once per block of 4 rows, so a
    prompt of n tokens pays n / 4 dequantisations: on a Zen 4 EPYC (2 cores) a gguf prefill cost
    1.77 ms a prompt token against bf16's 1.03. The copy is bf16 where the CPU computes bf16
    natively and fp32 where it emulates it (2 or 4 bytes a weight beside the codes' 0.6); with
    `--matmul onednn` it is packed like every other linear layer."""
    scale, zero = scales_and_zeros.float().unbind(-1)  # [groups, out] each
    weight = dequantise(codes, scale.T, zero.T)  # [out, in] fp32
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    dtype = torch.bfloat16 if native_bf16() else torch.float32
    linear.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
    return linear


def int4_rows(rows: Tensor, weight_int4: Tensor, scales_and_zeros: Tensor) -> Tensor:
    """rows [n, in] times an Int4GroupLinear's packed weight: [n, out] bf16."""
    return torch._weight_int4pack_mm_for_cpu(
        rows.to(torch.bfloat16), weight_int4, GROUP, scales_and_zeros
    )


def load_gguf_linears(
    model: nn.Module, gguf_path: Path, layer: type[Int4GroupLinear] = Int4GroupLinear
) -> dict[str, int]:
    """Replace each linear layer of `model` that the GGUF at `gguf_path` ships as Q4_1 by a
    `layer` (an Int4GroupLinear, or dtype gguf-a8's dcoco.models.target.int4_dot.Int4DotLinear) over
    the file's own codes; returns {tensor type: count} of what ran natively.
    Layers that read one input (q/k/v, gate/up) run as one product
    (dcoco.models.target.shared_input).

    Every replaced layer is checked against the weight `model` already holds (the same file
    dequantised), so a GGUF of another model is refused instead of silently served."""
    import gguf

    if next(model.parameters()).device.type != "cpu":
        raise DcocoError("dtype gguf is a CPU precision (torch's int4 CPU kernel); use bf16")
    config = model.config
    codes_of: dict[str, tuple[Tensor, Tensor, Tensor, Tensor | None]] = {}
    for tensor in gguf.GGUFReader(str(gguf_path)).tensors:
        parts = tensor.name.split(".")  # blk.<i>.<kind>.weight
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in LINEAR_KINDS:
            continue
        if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_1:
            continue
        path = f"model.layers.{parts[1]}.{LINEAR_KINDS[parts[2]]}"
        linear = model.get_submodule(path)
        rows, cols = linear.out_features, linear.in_features
        codes, scale, zero = q4_1_blocks(tensor.data, rows, cols)
        order = _hf_row_order(parts[2], rows, config)
        codes, scale, zero = codes[order], scale[order], zero[order]
        _check_same_weight(path, codes, scale, zero, linear.weight)
        codes_of[path] = (codes, scale, zero, linear.bias)
    if not codes_of:
        raise DcocoError(f"{gguf_path.name} has no Q4_1 linear layers for dtype gguf; use bf16")
    install_int4(model, codes_of, layer)
    return {"Q4_1": len(codes_of)}


def install_int4(model: nn.Module, codes_of: dict,
                 layer: type[Int4GroupLinear] = Int4GroupLinear) -> None:  # fmt: skip
    """Set each module path of `codes_of` ({path: (codes, scale, zero, bias)}) to its int4
    `layer`, fusing the groups of SHARED_INPUT whose members are all there and bias-free."""
    fused: set[str] = set()
    for path in codes_of:
        block, _, name = path.rpartition(".")
        group = next((g for g in SHARED_INPUT if name in g), None)
        members = [f"{block}.{member}" for member in group] if group else []
        if not members or members[0] != path or not all(m in codes_of for m in members):
            continue
        if any(codes_of[m][3] is not None for m in members):
            continue
        stacked = [torch.cat([codes_of[m][i] for m in members]) for i in range(3)]
        product = SharedProduct(layer(*stacked), len(members))
        widths = [codes_of[m][0].shape[0] for m in members]
        for member, piece in zip(members, slices(product, widths), strict=True):
            model.set_submodule(member, piece)
        fused.update(members)
    for path, (codes, scale, zero, bias) in codes_of.items():
        if path not in fused:
            model.set_submodule(path, layer(codes, scale, zero, bias))


def dequantise(codes: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """W [out, in] in fp32 from codes [out, in] and per-group scale, zero [out, in / 32]."""
    return (codes.float() - 8) * scale.repeat_interleave(GROUP, 1) + zero.repeat_interleave(
        GROUP, 1
    )


def _hf_row_order(kind: str, rows: int, config) -> Tensor:
    """The GGUF converter permutes q and k rows for llama.cpp's rotary layout; transformers undoes
    it on load. The same permutation of row indices puts codes in the HF model's row order."""
    index = torch.arange(rows)
    if kind not in ("attn_q", "attn_k"):
        return index
    heads = config.num_attention_heads if kind == "attn_q" else config.num_key_value_heads
    return index.reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


def _check_same_weight(path: str, codes: Tensor, scale: Tensor, zero: Tensor, weight: Tensor):
    expected = weight.detach().float()
    got = dequantise(codes, scale, zero)
    # the model's copy went through its load dtype: allow that rounding, not another model
    tolerance = 1e-6 + expected.abs().max().item() * 2.0**-7
    if (got - expected).abs().max().item() > tolerance:
        raise DcocoError(
            f"the GGUF's {path} does not match the loaded target's weights: wrong GGUF for "
            "this target"
        )
