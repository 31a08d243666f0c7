"""Attention kernel `rowwise`: a k-token verify computes each query row exactly as the 1-token
decoding step at that position does, so greedy speculative output equals plain decoding's.

SDPA (and eager's bf16 matmuls) pick their CPU kernels by shape: the 1-query step and a k-query
verify block and accumulate differently (on AMX a multi-row product takes the tile path), so a
near-tie in the logits can flip between them. Here a verify of k ≤ MAX_ROWWISE_QUERIES queries over
a cache runs k one-query SDPA calls, query i over the causal prefix of its own length, which is
the very call the step makes; the step itself, prefill and batches run SDPA unchanged. The linear
layers must be row-invariant too (gguf's int4 kernel and int8's are, see their tests).

Each one-query call runs SDPA, except in bf16 or fp16 on a CPU without AMX: there SDPA's
half-precision kernel is slow for one query, and the same product in fp32 (upcast q, K and V,
SDPA's fp32 kernel, round once) is faster. One SmolLM2 layer's call on 2 cores, 300 / 1,000
keys: 218 / 727 µs against 97 / 194 µs (the fp32 product then written as three ops) on an
AVX2-only Zen 3; 175-300 / 540-990 µs against 58-98 / 131-238 µs on a Zen 4 EPYC with AVX-512
bf16 (a gguf 8-token verify there 72.7 → 41.1 ms, interleaved), while on an AMX Xeon SDPA's bf16
call took about 27 µs. Verify rows and steps take the same path, so rows stay equal to steps.

Where the rows compute in fp32, the cache keeps the K/V in fp32 too (kv_storage_dtype): each new
position is upcast once when it is written, where the one-query call upcast the whole cache in
every layer of every step (1.5 of a 13.4 ms gguf step at 300 positions, Zen 4 EPYC, under the
profiler). The values are the half-precision ones exactly, so nothing computed changes.

Measured cost: see `dcoco profile` (the `rowwise` rows) and the README's precision section.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dcoco.models.target.packed_linear import amx_bf16

ROWWISE = "dcoco_rowwise"  # the name transformers knows it by
MAX_ROWWISE_QUERIES = 16  # longer inputs are prefills: one SDPA call, like every method's prefill


def rowwise_attention_forward(
    module: torch.nn.Module,
    query: Tensor,  # [batch, heads, queries, head_dim]
    key: Tensor,  # [batch, kv_heads, past + queries, head_dim]
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs,
) -> tuple[Tensor, None]:
    batch, _, queries, _ = query.shape
    past = key.shape[2] - queries
    if batch != 1 or past == 0 or queries > MAX_ROWWISE_QUERIES:
        key, value = key.to(query.dtype), value.to(query.dtype)  # an fp32 cache's exact values
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # One sequence without padding: its causal prefix is its whole mask, so every row (the step's
    # single row included) runs unmasked over exactly the keys it may see.
    kwargs.pop("is_causal", None)
    fp32 = fp32_math_pays(query, kwargs)
    if queries == 1:  # the step: the one row's call, without the split and join
        return one_query(module, query, key, value, kwargs, fp32), None
    dtype = query.dtype
    if fp32:  # upcast once for every row, round once after: a row's slice holds the same values
        query, key, value = query.float(), key.float(), value.float()
    rows = [
        one_query(
            module,
            query[:, :, i : i + 1],
            key[:, :, : past + i + 1],
            value[:, :, : past + i + 1],
            kwargs,
            fp32,
        )
        for i in range(queries)
    ]
    return torch.cat(rows, dim=1).to(dtype), None  # [batch, queries, heads, head_dim]


def one_query(
    module, query: Tensor, key: Tensor, value: Tensor, kwargs: dict, fp32: bool | None = None
) -> Tensor:
    """[1, 1, heads, head_dim]: one query row [1, heads, 1, head_dim] over all of key and value
    [1, kv_heads, keys, head_dim], unmasked (its causal prefix is what it is given); `fp32`: as
    one fp32 product rather than SDPA (None: fp32_math_pays decides)."""
    if not (fp32_math_pays(query, kwargs) if fp32 is None else fp32):
        key, value = key.to(query.dtype), value.to(query.dtype)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=False, **kwargs)[0]
    # SDPA's fp32 kernel: one call, where q Kᵀ, softmax and P V as three ops took 1.5x its time
    # (Zen 4, 300 keys: small fp32 matmuls pay their dispatch)
    out = F.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), scale=kwargs["scaling"], enable_gqa=True
    )  # [1, heads, 1, head_dim]
    return out.transpose(1, 2).to(query.dtype)


def fp32_math_pays(query: Tensor, kwargs: dict) -> bool:
    """A half-precision row on a CPU without AMX, and nothing in `kwargs` the plain product
    leaves out (dropout, a sliding window, soft-capping, sinks)."""
    plain = {"scaling", "dropout", "position_ids", "cache_position", "use_cache"}
    extra = [name for name, value in kwargs.items() if name not in plain and value is not None]
    if extra or kwargs.get("dropout") or kwargs.get("scaling") is None:
        return False
    return _fp32_rows(query.dtype, query.device)


def _fp32_rows(dtype: torch.dtype, device: torch.device) -> bool:
    """Half precision on a CPU without AMX: where rows compute in fp32."""
    half = dtype in (torch.bfloat16, torch.float16)
    return half and device.type == "cpu" and not amx_bf16()


def kv_storage_dtype(attention: str, dtype: torch.dtype, device: torch.device):
    """fp32 for the K/V cache of a model under `rowwise` where its rows compute in fp32; else
    None (the K/V's own dtype)."""
    return torch.float32 if attention == ROWWISE and _fp32_rows(dtype, device) else None


def hf_attention(kernel: str) -> str:
    """The attn_implementation transformers takes for our kernel name."""
    return ROWWISE if kernel == "rowwise" else kernel


AttentionInterface.register(ROWWISE, rowwise_attention_forward)
AttentionMaskInterface.register(ROWWISE, sdpa_mask)
