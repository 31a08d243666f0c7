"""Attention kernel `rowwise`: a k-token verify computes each query row exactly as the 1-token
decoding step at that position does, so greedy speculative output equals plain decoding's.

SDPA (and eager's bf16 matmuls) pick their CPU kernels by shape: the 1-query step and a k-query
verify block and accumulate differently (on AMX a multi-row product takes the tile path), so a
near-tie in the logits can flip between them. Here a verify of k ≤ MAX_ROWWISE_QUERIES queries over
a cache runs k one-query SDPA calls, query i over the causal prefix of its own length, which is
the very call the step makes; the step itself, prefill and batches run SDPA unchanged. The linear
layers must be row-invariant too (gguf's int4 kernel and int8's are, see their tests).

Each one-query call runs SDPA, except in bf16 or fp16 on a CPU without native bf16 (AVX2 only):
there SDPA's half-precision kernel took 218 µs a call over 300 keys and 727 µs over 1,000 (one
SmolLM2 layer, 2 cores of a Zen 3), the same product in fp32 (upcast K and V, q Kᵀ, softmax, P V,
round once) 97 and 194 µs. Verify rows and steps take the same path, so rows stay equal to steps.

Measured cost: see `dcoco profile` (the `rowwise` rows) and the README's precision section.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dcoco.models.packed_linear import native_bf16

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
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # One sequence without padding: its causal prefix is its whole mask, so every row (the step's
    # single row included) runs unmasked over exactly the keys it may see.
    kwargs.pop("is_causal", None)
    fp32 = fp32_math_pays(query, kwargs)
    if queries == 1:  # the step: the one row's call, without the split and join
        return one_query(module, query, key, value, kwargs, fp32), None
    if fp32:  # upcast once for every row: a row's slice of it holds the values it would upcast
        key, value = key.float(), value.float()
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
    return torch.cat(rows, dim=1), None  # [batch, queries, heads, head_dim]


def one_query(
    module, query: Tensor, key: Tensor, value: Tensor, kwargs: dict, fp32: bool | None = None
) -> Tensor:
    """[1, 1, heads, head_dim]: one query row [1, heads, 1, head_dim] over all of key and value
    [1, kv_heads, keys, head_dim], unmasked (its causal prefix is what it is given); `fp32`: as
    one fp32 product rather than SDPA (None: fp32_math_pays decides)."""
    if not (fp32_math_pays(query, kwargs) if fp32 is None else fp32):
        return sdpa_attention_forward(module, query, key, value, None, is_causal=False, **kwargs)[0]
    kv_heads, head_dim = key.shape[1], key.shape[-1]
    grouped = query.float().view(1, kv_heads, -1, head_dim)  # query heads by the K/V they read
    weights = torch.matmul(grouped, key.float().transpose(-1, -2)) * kwargs["scaling"]
    out = torch.matmul(torch.softmax(weights, dim=-1), value.float())  # [1, kv, group, head_dim]
    return out.view(1, 1, -1, head_dim).to(query.dtype)


def fp32_math_pays(query: Tensor, kwargs: dict) -> bool:
    """A half-precision row on a CPU without native bf16, and nothing in `kwargs` the plain
    product leaves out (dropout, a sliding window, soft-capping, sinks)."""
    if query.dtype not in (torch.bfloat16, torch.float16) or query.device.type != "cpu":
        return False
    plain = {"scaling", "dropout", "position_ids", "cache_position", "use_cache"}
    extra = [name for name, value in kwargs.items() if name not in plain and value is not None]
    if extra or kwargs.get("dropout") or kwargs.get("scaling") is None:
        return False
    return not native_bf16()


def hf_attention(kernel: str) -> str:
    """The attn_implementation transformers takes for our kernel name."""
    return ROWWISE if kernel == "rowwise" else kernel


AttentionInterface.register(ROWWISE, rowwise_attention_forward)
AttentionMaskInterface.register(ROWWISE, sdpa_mask)
