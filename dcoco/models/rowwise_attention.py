"""Attention kernel `rowwise`: a k-token verify computes each query row exactly as the 1-token
decoding step at that position does, so greedy speculative output equals plain decoding's.

SDPA (and eager's bf16 matmuls) pick their CPU kernels by shape: the 1-query step and a k-query
verify block and accumulate differently (on AMX a multi-row product takes the tile path), so a
near-tie in the logits can flip between them. Here a verify of k ≤ MAX_ROWWISE_QUERIES queries over
a cache runs k one-query SDPA calls, query i over the causal prefix of its own length, which is
the very call the step makes; the step itself, prefill and batches run SDPA unchanged. The linear
layers must be row-invariant too (gguf's int4 kernel and int8's are, see their tests).

Measured cost: see `dcoco profile` (the `rowwise` rows) and the README's precision section.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

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
    if queries == 1:  # the step: the one row's call, without the split and join
        return sdpa_attention_forward(module, query, key, value, None, is_causal=False, **kwargs)
    rows = [
        sdpa_attention_forward(
            module,
            query[:, :, i : i + 1],
            key[:, :, : past + i + 1],
            value[:, :, : past + i + 1],
            None,
            is_causal=False,
            **kwargs,
        )[0]
        for i in range(queries)
    ]
    return torch.cat(rows, dim=1), None  # [batch, queries, heads, head_dim]


def hf_attention(kernel: str) -> str:
    """The attn_implementation transformers takes for our kernel name."""
    return ROWWISE if kernel == "rowwise" else kernel


AttentionInterface.register(ROWWISE, rowwise_attention_forward)
AttentionMaskInterface.register(ROWWISE, sdpa_mask)
