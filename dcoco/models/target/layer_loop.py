"""The decoding step's own pass through the target's decoder layers.

A batch-1 step on a small model spends a large share of its time in transformers' per-call
machinery around the arithmetic: the mask builder, output records, keyword plumbing and the
decorators of every layer. This loop calls the same modules in the same order (norms, q/k/v,
rotary, cache update, the configured attention function, o, MLP) and nothing else, so its logits
are bit-equal to the model's own forward (tests/test_layer_loop.py) at every precision: the
linear layers are whatever the model holds (bf16, int8, gguf's int4, packed oneDNN).

It takes only the calls whose attention needs no mask: one sequence, no padding, after a prefill
(cache length > 0), with the `rowwise` kernel (every row runs unmasked over its causal prefix) for
up to MAX_ROWWISE_QUERIES tokens, or SDPA for a single token. Prefills, batches and other
architectures take the model's forward. Measured with scripts/reproduce/fused_step.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from dcoco.models.cpu import cpu_kernels
from dcoco.models.target.gguf_weights import Int4GroupLinear, int4_rows
from dcoco.models.target.rowwise_attention import MAX_ROWWISE_QUERIES, ROWWISE
from dcoco.models.target.shared_input import OutputSlice

# decoder layers whose forward is exactly: norm, attention (q/k/v, Qwen3's per-head q/k norms,
# rotary, cache, attention, o), residual, norm, MLP (down(act(gate) * up)), residual
LAYER_KINDS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")
LOOP_ATTENTIONS = (ROWWISE, "sdpa")
RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")


def layer_loop_for(model: nn.Module) -> LayerLoop | None:
    """A LayerLoop over `model` (a causal LM) when its layers are of a kind the loop reproduces
    and attend to every position, else None (the model's own forward serves every call)."""
    config = model.config
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None or any(type(layer).__name__ not in LAYER_KINDS for layer in layers):
        return None
    if getattr(config, "_attn_implementation", None) not in LOOP_ATTENTIONS:
        return None
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return None
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return None
    return LayerLoop(body, config._attn_implementation)


class LayerLoop:
    """The decoder stack of `body` (a LlamaModel-like module) for mask-free decoding calls.

    Hidden states run as rows [tokens, hidden] (the batch is one sequence); submodules are called
    through their `forward` (not `__call__`: a step makes some 400 such calls, and the hooks
    `__call__` checks for are never set on them), gguf's int4 layers as their kernel, and layers
    that share an input as one product (dcoco.models.target.shared_input) run that product once."""

    def __init__(self, body: nn.Module, attention: str):
        self.body = body
        self.attention = attention
        self.attend = ALL_ATTENTION_FUNCTIONS[attention]
        self.layers = [_LayerCalls.of(layer) for layer in body.layers]
        self.final_norm = _norm(body.norm)

    def takes(self, input_ids: Tensor, cache: DynamicCache | None, attention_mask) -> bool:
        """Whether this call is one the loop computes exactly as the model's forward."""
        if cache is None or attention_mask is not None or input_ids.shape[0] != 1:
            return False
        if cache.get_seq_length() == 0:
            return False
        limit = MAX_ROWWISE_QUERIES if self.attention == ROWWISE else 1
        return input_ids.shape[1] <= limit

    def forward(
        self,
        input_ids: Tensor,  # [1, tokens]
        cache: DynamicCache,
        taps: tuple[int, ...] = (),
    ) -> tuple[Tensor, dict[int, Tensor]]:
        """The final norm's output [1, tokens, hidden] and each tapped layer's output."""
        past = cache.get_seq_length()
        hidden = self.body.embed_tokens.forward(input_ids[0])  # [tokens, hidden]
        positions = torch.arange(past, past + input_ids.shape[1], device=hidden.device)[None]
        rotary = _Rotary(*self.body.rotary_emb.forward(hidden, positions))
        captured: dict[int, Tensor] = {}
        for index, calls in enumerate(self.layers):
            hidden = hidden + self._attention(calls, calls.norm_in(hidden), rotary, cache)
            gate, up = calls.gate_up(calls.norm_post(hidden))
            hidden = hidden + calls.down(calls.act(gate) * up)
            if index in taps:
                captured[index] = hidden[None]
        return self.final_norm(hidden)[None], captured

    def _attention(self, calls: _LayerCalls, hidden: Tensor, rotary: _Rotary, cache) -> Tensor:
        """LlamaAttention's arithmetic: [tokens, hidden] -> [tokens, hidden]."""
        attn = calls.attn
        if calls.qkv_joint is None:
            shape = (1, hidden.shape[0], -1, attn.head_dim)  # [1, tokens, heads, head_dim]
            query, key, value = (part.view(shape) for part in calls.qkv(hidden))
            query = calls.q_norm(query).transpose(1, 2)  # [1, heads, tokens, head_dim]
            key, value = calls.k_norm(key).transpose(1, 2), value.transpose(1, 2)
            query, key = apply_rotary_pos_emb(query, key, rotary.cos, rotary.sin)
        else:
            query, key, value = _rotated_qkv(calls, hidden, rotary, attn.head_dim)
        key, value = cache.update(key, value, attn.layer_idx)
        out, _ = self.attend(attn, query, key, value, None, dropout=0.0, scaling=attn.scaling)
        return calls.o(out.reshape(hidden.shape[0], -1).contiguous())


@dataclass(frozen=True)
class _LayerCalls:
    """One decoder layer's submodules as the calls the loop makes."""

    attn: nn.Module
    norm_in: Callable[[Tensor], Tensor]
    qkv: Callable[[Tensor], tuple[Tensor, ...]]
    # q, k and v as one product [tokens, (q + k + v heads) * head_dim] where the layer has one
    # and no per-head norms, with q's and k's head counts: rotated as one tensor (_rotated_qkv)
    qkv_joint: Callable[[Tensor], Tensor] | None
    q_heads: int
    k_heads: int
    q_norm: Callable[[Tensor], Tensor]  # per head (Qwen3), else the identity
    k_norm: Callable[[Tensor], Tensor]
    o: Callable[[Tensor], Tensor]
    norm_post: Callable[[Tensor], Tensor]
    gate_up: Callable[[Tensor], tuple[Tensor, ...]]
    act: Callable[[Tensor], Tensor]
    down: Callable[[Tensor], Tensor]

    @staticmethod
    def of(layer: nn.Module) -> _LayerCalls:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
        per_head_norms = hasattr(attn, "q_norm") or hasattr(attn, "k_norm")
        return _LayerCalls(
            attn=attn,
            norm_in=_norm(layer.input_layernorm),
            qkv=_one_input(qkv),
            qkv_joint=None if per_head_norms else _shared_product(qkv),
            q_heads=attn.q_proj.out_features // attn.head_dim,
            k_heads=attn.k_proj.out_features // attn.head_dim,
            q_norm=_norm_or_identity(getattr(attn, "q_norm", None)),
            k_norm=_norm_or_identity(getattr(attn, "k_norm", None)),
            o=_rows(attn.o_proj),
            norm_post=_norm(layer.post_attention_layernorm),
            gate_up=_one_input((mlp.gate_proj, mlp.up_proj)),
            act=mlp.act_fn.forward,
            down=_rows(mlp.down_proj),
        )


def _one_input(modules: tuple[nn.Module, ...]) -> Callable[[Tensor], tuple[Tensor, ...]]:
    """The outputs of `modules` over one input: one product split by columns where they are the
    slices, in order, of one SharedProduct; else one call each."""
    call = _shared_product(modules)
    if call is not None:
        widths = [m.out_features for m in modules]
        return lambda x: call(x).split(widths, dim=-1)
    calls = [_rows(m) for m in modules]
    return lambda x: tuple(call(x) for call in calls)


def _shared_product(modules: tuple[nn.Module, ...]) -> Callable[[Tensor], Tensor] | None:
    """The one product whose column slices, in order, `modules` are, else None."""
    product = getattr(modules[0], "product", None)
    in_order = [isinstance(m, OutputSlice) and m.product is product and m.part == i
                for i, m in enumerate(modules)]  # fmt: skip
    return _rows(product.linear) if all(in_order) and product.parts == len(modules) else None


@dataclass(frozen=True)
class _Rotary:
    """A step's rotary tables: cos and sin [1, tokens, head_dim] as the model computes them."""

    cos: Tensor
    sin: Tensor

    @functools.cached_property
    def by_head(self) -> tuple[Tensor, Tensor]:
        """cos and the signed sin [tokens, 1, head_dim] that turn rotate_half into a roll:
        rotate_half(x) * sin = roll(x, head_dim / 2) * (-sin_low, sin_high), exactly (a sign
        flip commutes with rounding), one table per step instead of per layer."""
        half = self.sin.shape[-1] // 2
        signed = torch.cat([-self.sin[..., :half], self.sin[..., half:]], dim=-1)
        return self.cos[0, :, None], signed[0, :, None]


def _rotated_qkv(calls: _LayerCalls, hidden: Tensor, rotary: _Rotary, head_dim: int):
    """query [1, q heads, tokens, head_dim] and key, value [1, k heads, tokens, head_dim] with q
    and k rotated as one tensor: apply_rotary_pos_emb's arithmetic (x cos + rotate_half(x) sin)
    on the heads of both at once, bit for bit."""
    heads = calls.qkv_joint(hidden).view(hidden.shape[0], -1, head_dim)  # [tokens, heads, d]
    rotated = calls.q_heads + calls.k_heads
    qk = rotate(heads[:, :rotated], *rotary.by_head)
    query = qk[:, : calls.q_heads].transpose(0, 1)[None]
    key = qk[:, calls.q_heads :].transpose(0, 1)[None]
    return query, key, heads[:, rotated:].transpose(0, 1)[None]


def _rows(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """`module`'s product over rows [tokens, in]: the int4 kernel itself for a bias-free
    Int4GroupLinear (the step's most frequent call), else the module's forward (gguf-a8's
    Int4DotLinear calls its kernel from there)."""
    if type(module) is Int4GroupLinear and module.bias is None:
        weight, scales = module.weight_int4, module.scales_and_zeros
        return lambda rows: int4_rows(rows, weight, scales)
    return module.forward


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The RMSNorm of the families the loop takes (and of the DFlash drafter's Qwen3 layers), in
    their forward's order: normalised in fp32 (`F.rms_norm`, one call for their six), rounded,
    times the weight; bit for bit (tests/test_layer_loop.py), a 1-row norm 22 -> 18 µs on a Zen 4
    EPYC. bf16 rows on a CPU take the fused kernel (dcoco.models.cpu.cpu_kernels, 16 -> 1.3 µs
    there),
    equal but where its fp32 sum of squares rounds differently (one bf16 step at most).
    `weight` [n], or [inner, n] for x [outer, inner, n]."""
    if cpu_kernels.takes(x) and weight.dtype == x.dtype:
        return cpu_kernels.rms_norm(x, weight.contiguous(), eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rotate(x: Tensor, cos: Tensor, signed_sin: Tensor, norm: Tensor | None = None,
           eps: float = 0.0) -> Tensor:  # fmt: skip
    """x [tokens, heads, head_dim] -> x cos + roll(x, head_dim / 2) signed_sin (rotate_half's
    rotation, cos and signed_sin [tokens, 1, head_dim]); with `norm` [heads, head_dim] each head
    RMS-normed first (rms_norm). The fused kernel for bf16 rows on a CPU (1-row q|k 7.8 -> 1.5 µs
    on a Zen 4 EPYC), else the operators; the rotation is bit-equal either way."""
    if cpu_kernels.takes(x) and cos.dtype == x.dtype and (norm is None or norm.dtype == x.dtype):
        return cpu_kernels.rotate(x, cos, signed_sin, None if norm is None else norm.contiguous(),
                                  eps)  # fmt: skip
    if norm is not None:
        x = rms_norm(x, norm, eps)
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def _norm(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """`module` as rms_norm where it is an RMSNorm of those families, else its forward."""
    if type(module).__name__ not in RMS_NORMS or not hasattr(module, "variance_epsilon"):
        return module.forward
    weight, eps = module.weight, module.variance_epsilon
    return lambda x: rms_norm(x, weight, eps)


def _norm_or_identity(module: nn.Module | None) -> Callable[[Tensor], Tensor]:
    return (lambda x: x) if module is None else _norm(module)
