"""The drafter's decoding pass: BlockDrafter.forward's arithmetic for one sequence, in few calls.

A draft pass on a CPU is two small layers over a handful of rows, so eagerly it is mostly the
fixed cost of its calls: transformers' norms take 8 operators each, RoPE 7 per tensor, and q, k,
v, gate and up are five products. This pass reads the drafter's weights once into fused products
(q|k|v over the context and block rows together, gate|up over the block) and runs each norm as
its own four operators, q's and k's per-head norms as one, and the rotation of q and k as one
roll against signed sine tables made once for many passes; the last layer runs the mask slots'
rows only (the anchor's output there is never read). With the same weights its keys and values are
bit-equal to the module's, and its hidden states equal up to the rounding of products over fewer
rows (tests/test_draft_pass.py). 2-core AMD EPYC (Zen 4), bf16, a block of 8 after 300 tokens:
4.6 -> 3.5 ms a draft of 3 (scripts/reproduce/draft_pass_cost.py).

The products are plain linear layers in the drafter's dtype (decoding packs them where the target's
are packed), int4 groups (`--draft-dtype int4`, dcoco.models.target.int4_groups) or int4 groups over
int8-rounded rows (`w4a8`, dcoco.models.target.int4_dot; a layer's q|k|v with its norms and rotary,
and its MLP, then run as one C++ call each: int4_dot.qkv and .mlp). Its bf16 attention runs on a C++
kernel where the CPU has AVX-512 bf16 (dcoco.models.cpu.cpu_kernels.draft_attention: 16-55 against
SDPA's 45-81 µs for 6-24 query rows over 307 keys, Zen 4), reading the query heads in place, else
SDPA. Batches of more than one sequence, and training, take the module's forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache

from dcoco.models.cpu import cpu_kernels
from dcoco.models.target import int4_dot
from dcoco.models.target.cache import cache_length
from dcoco.models.target.layer_loop import rms_norm, rotate

Product = Callable[[Tensor], nn.Module]  # a weight [out, in] -> the layer computing x Wᵀ
# Context rows up to which a w4a8 product stays on the int8-row kernel, MAX_ROWS rows a call: a
# pass after plain cycles reads every tap they skipped. A pass of 3 drafts after 32 such positions
# took 1.12 ms so against 1.41 ms on the layers' dequantised copy, after 64 1.61 against 1.85 ms;
# from 128 on they were even (2-core Zen 4, scripts/reproduce/draft_catch_up.py). Longer contexts
# (a prompt's first pass) keep the dequantised copy.
CATCH_UP_ROWS = 128


def dense_product(weight: Tensor) -> nn.Module:
    """A bias-free linear layer holding `weight` [out, in] as it is."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
    return linear


class _DraftLayer(nn.Module):
    """One DFlash decoder layer's weights as the pass uses them."""

    def __init__(self, layer: nn.Module, product: Product):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.index = attn.layer_idx
        self.head_dim = attn.head_dim
        self.q_heads = attn.q_proj.out_features // attn.head_dim
        self.k_heads = attn.k_proj.out_features // attn.head_dim
        self.qkv = product(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        self.o = product(attn.o_proj.weight)
        self.gate_up = product(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        self.down = product(mlp.down_proj.weight)
        self.intermediate = mlp.gate_proj.out_features
        # w4a8: q|k|v with its norms and rotary, and the MLP, one C++ call each (int4_dot)
        self.fused = int4_dot.all_w4a8(self.qkv, self.gate_up, self.down)
        self.norm_in = layer.input_layernorm.weight.detach()
        self.norm_post = layer.post_attention_layernorm.weight.detach()
        # q's and k's per-head norm weights, one row per head of the joint q|k heads [q+k, dim]
        q_norm = attn.q_norm.weight.detach().expand(self.q_heads, -1)
        k_norm = attn.k_norm.weight.detach().expand(self.k_heads, -1)
        self.qk_norm = torch.cat([q_norm, k_norm]).contiguous()
        self.eps = layer.input_layernorm.variance_epsilon


class DraftPass(nn.Module):
    """`drafter`'s decoder stack as fused products (`product` makes each from a weight)."""

    def __init__(self, drafter: nn.Module, product: Product = dense_product):
        super().__init__()
        config = drafter.config
        self.layers = nn.ModuleList(_DraftLayer(layer, product) for layer in drafter.layers)
        self.fc = product(drafter.fc.weight)
        self.hidden_norm = drafter.hidden_norm.weight.detach()
        self.norm = drafter.norm.weight.detach()
        self.eps = config.rms_norm_eps
        device = self.norm.device
        half = torch.arange(0, config.head_dim, 2, dtype=torch.float32, device=device)
        self.inv_freq = 1.0 / config.rope_theta ** (half / config.head_dim)  # [head_dim / 2]
        self._tables: dict[torch.dtype, tuple[Tensor, Tensor]] = {}  # dtype -> cos, signed sin

    def _product(self, layer: nn.Module, rows: Tensor) -> Tensor:
        # its forward, not __call__: no hooks are ever set on these, and a pass makes ten calls;
        # int4 layers answer in bf16 whatever they are given
        count = rows.shape[0]
        if isinstance(layer, int4_dot.Int4DotLinear) and int4_dot.MAX_ROWS < count <= CATCH_UP_ROWS:
            # each row is computed alone: the same values as the calls of the steps it catches up
            out = torch.cat([layer.forward(chunk) for chunk in rows.split(int4_dot.MAX_ROWS)])
        else:
            out = layer.forward(rows)
        return out if out.dtype == rows.dtype else out.to(rows.dtype)

    def _rotary(self, start: int, stop: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and the signed sin [positions, 1, head_dim] for positions start..stop-1, as the
        drafter's tables round them; x cos + roll(x, half) signed_sin = x cos + rotate_half(x)
        sin exactly (a sign flip commutes with rounding). Slices of tables made once for twice
        the positions asked (each position's values are its own: the same numbers as made per
        pass, without the ~8 operators a pass)."""
        tables = self._tables.get(dtype)
        if tables is None or tables[0].shape[0] < stop:
            positions = torch.arange(0, max(2 * stop, 1024), dtype=torch.float32,
                                     device=self.inv_freq.device)  # fmt: skip
            angles = positions[:, None] * self.inv_freq  # [positions, head_dim / 2]
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
            tables = torch.cat([cos, cos], -1)[:, None], torch.cat([-sin, sin], -1)[:, None]
            self._tables[dtype] = tables
        return tables[0][start:stop], tables[1][start:stop]

    def forward(self, block: Tensor, context: Tensor, cache: DynamicCache) -> Tensor:
        """block [rows, hidden] (embedded ids, the anchor first), context [tokens, taps * hidden]
        (the new taps) -> the mask slots' hidden states [rows - 1, hidden] after the final norm.
        The anchor's row ends at the last layer's keys and values: its output is never read.
        The new context's and the block's K/V are appended to `cache`; the caller crops the
        block's back out."""
        start, num_context = cache_length(cache), context.shape[0]
        hidden = block.to(self.norm.dtype)
        fused = self._product(self.fc, context.to(hidden.dtype))
        fused = rms_norm(fused, self.hidden_norm, self.eps)  # [tokens, hidden]
        rotary = self._rotary(start, start + num_context + hidden.shape[0], hidden.dtype)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            first_query = 1 if index == last else 0  # the anchor's last output is never read
            attended = self._attention(layer, hidden, fused, rotary, cache, first_query)
            hidden = self._mlp(layer, hidden[first_query:] + attended)
        return rms_norm(hidden, self.norm, self.eps)

    def _mlp(self, layer: _DraftLayer, hidden: Tensor) -> Tensor:
        """hidden [rows, hidden] plus the layer's MLP of its norm; on w4a8 products one C++ call
        (dcoco.models.target.int4_dot.mlp) in place of ten."""
        if layer.fused and cpu_kernels.takes(hidden) and hidden.shape[0] <= int4_dot.MAX_ROWS:
            return int4_dot.mlp(hidden, layer.norm_post, layer.eps, layer.gate_up, layer.down,
                                layer.intermediate)  # fmt: skip
        gate, up = self._product(layer.gate_up, rms_norm(hidden, layer.norm_post, layer.eps)).split(
            layer.intermediate, dim=-1
        )
        return hidden + self._product(layer.down, F.silu(gate) * up)

    def _attention(self, layer: _DraftLayer, hidden: Tensor, fused: Tensor,
                   rotary: tuple[Tensor, Tensor], cache: DynamicCache,
                   first_query: int) -> Tensor:  # fmt: skip
        """[rows, hidden] -> [rows - first_query, hidden]: the block's rows from `first_query`
        on as queries over [cache; context; block]."""
        num_context = fused.shape[0]
        qk, heads = self._heads(layer, hidden, fused, rotary)
        key = qk[:, layer.q_heads :].transpose(0, 1)[None]  # [1, kv heads, positions, dim]
        value = heads[:, layer.q_heads + layer.k_heads :].transpose(0, 1)[None]
        key, value = cache.update(key, value, layer.index)
        query = qk[num_context + first_query :, : layer.q_heads]  # [queries, heads, dim]
        if cpu_kernels.attends(query, key):  # 1.5-3x faster than SDPA at these sizes (Zen 4)
            out = cpu_kernels.draft_attention(query, key, value)  # grouped heads read in place
        else:
            out = self._sdpa(query, key, value, layer.k_heads)
        return self._product(layer.o, out)

    def _heads(self, layer: _DraftLayer, hidden: Tensor, fused: Tensor,
               rotary: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:  # fmt: skip
        """The q|k|v heads of [context; norm(block rows)]: (q's and k's normed per head, then
        rotated [positions, q+k, dim]; every head as the product left them)."""
        positions = fused.shape[0] + hidden.shape[0]
        if layer.fused and cpu_kernels.takes(hidden) and positions <= int4_dot.MAX_ROWS:
            return int4_dot.qkv(hidden, fused, layer.norm_in, layer.eps, layer.qkv,
                                layer.qk_norm, *rotary)  # fmt: skip
        kv_input = torch.cat([fused, rms_norm(hidden, layer.norm_in, layer.eps)])
        heads = self._product(layer.qkv, kv_input).view(positions, -1, layer.head_dim)
        rotated = layer.q_heads + layer.k_heads
        qk = rotate(heads[:, :rotated], *rotary, norm=layer.qk_norm, eps=layer.eps)
        return qk, heads

    @staticmethod
    def _sdpa(query: Tensor, key: Tensor, value: Tensor, kv_heads: int) -> Tensor:
        """query [queries, heads, dim] over key, value [1, kv heads, positions, dim] ->
        [queries, heads * dim]: each kv head's query heads as one longer run of queries, so
        grouped-query attention is plain attention (54 against 76 µs for SDPA's own grouping,
        4 queries over 310 keys, Zen 4)."""
        queries, heads, dim = query.shape
        group = heads // kv_heads
        query = query.unflatten(1, (kv_heads, group)).transpose(0, 1)
        query = query.reshape(1, kv_heads, queries * group, dim)
        out = F.scaled_dot_product_attention(query, key, value)  # [1, kv heads, q * group, dim]
        return out[0].unflatten(1, (queries, group)).transpose(0, 1).reshape(queries, -1)
