"""What fusing the small ops of a gguf decoding step would buy (issue 28, exploratory).

A gguf step spends about half its time outside the int4 products, the head and attention: some
1,650 small aten ops (norms, rotary, SiLU-and-multiply, views) and their dispatch. This times a
step and a 4-token verify four ways, interleaved call after call on one context:

- `hf`: transformers' forward (what the engine ran before dcoco.models.target.layer_loop);
- `engine`: the target's forward as the engine runs it (dcoco.models.target.layer_loop);
- `loop`: a layer loop over the same weights calling the kernels directly (norm, q/k/v,
  rotary / cache, attention / o, norm, MLP), eager;
- `compiled`: the same loop with the parts between attention calls compiled by inductor
  (dynamic row count; the cache update and attention stay eager).

It also checks what the engine needs from a kernel: each row of the compiled verify equals the
compiled step at that position (row invariance, bit for bit), and how far compiled logits are
from the target's own.

Measured 2026-12-04 on 2 cores of an Intel Xeon (AMX), a contended VM (HF's step took 36 ms where
it took 13-14 ms the day before), context 300 / 1,000: `loop` 1.37× / 1.31× HF's speed at 1 token
and 1.31× / 1.28× at 4, logits bit-equal to HF's and verify rows equal to steps; `compiled` 1.04×
/ 1.02× (the guards and graph calls eat what fusion saves) with logits up to 0.625 away from HF's
(argmax equal). So the cost to cut is the model's per-call machinery, not the kernels' count.
With the engine's loop in place (same VM, later): `engine` 1.30x / 1.25x HF's speed at 1 / 4 tokens,
`loop` 1.34x / 1.27x.

Usage: .venv/bin/python scripts/reproduce/fused_step.py [CONTEXT]   (default 300)
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from dcoco.decode.cost_curve import interleaved_ms, machine_fingerprint
from dcoco.models.target.cache import crop_cache, new_cache
from dcoco.models.target.gguf_weights import int4_rows
from dcoco.models.target.loading import load_target
from dcoco.models.target.rowwise_attention import rowwise_attention_forward

TARGET, VERIFY, REPEATS = "smollm2-135m-instruct", 4, 30


def rms_norm(hidden, weight, eps: float):  # LlamaRMSNorm's arithmetic
    h = hidden.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(hidden.dtype)


def pre_attention(hidden, norm_w, qkv_w, qkv_s, cos, sin, eps: float, head_dim: int, q_heads: int):
    """[1, n, hidden] -> q [1, heads, n, d], k and v [1, kv_heads, n, d], rotated."""
    n = hidden.shape[1]
    h = rms_norm(hidden, norm_w, eps)
    qkv = int4_rows(h.reshape(n, -1), qkv_w, qkv_s).view(1, n, -1, head_dim)
    kv_heads = (qkv.shape[2] - q_heads) // 2
    q, k, v = qkv.split([q_heads, kv_heads, kv_heads], dim=2)
    q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q, k, v.transpose(1, 2)


def post_attention(hidden, attn, o_w, o_s, norm_w, gu_w, gu_s, down_w, down_s, eps: float):
    """hidden [1, n, hidden] + attention out [1, n, heads, d] -> the layer's output."""
    n = hidden.shape[1]
    hidden = hidden + int4_rows(attn.reshape(n, -1), o_w, o_s).view_as(hidden)
    h = rms_norm(hidden, norm_w, eps).reshape(n, -1)
    gate, up = int4_rows(h, gu_w, gu_s).chunk(2, dim=-1)
    return hidden + int4_rows(F.silu(gate) * up, down_w, down_s).view_as(hidden)


class LayerLoop:
    """The target's decoder stack as pre / cache + attention / post per layer."""

    def __init__(self, target, compiled: bool):
        model = target.model.model
        self.model, self.target = model, target
        self.eps = model.config.rms_norm_eps
        self.head_dim = model.config.head_dim
        self.q_heads = model.config.num_attention_heads
        self.layers = [self._weights(layer) for layer in model.layers]
        self.pre, self.post = pre_attention, post_attention
        self.norm = rms_norm
        if compiled:
            self.pre = torch.compile(pre_attention, dynamic=True, fullgraph=True)
            self.post = torch.compile(post_attention, dynamic=True, fullgraph=True)
            self.norm = torch.compile(rms_norm, dynamic=True, fullgraph=True)

    @staticmethod
    def _weights(layer):
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = attn.q_proj.product.linear, mlp.gate_proj.product.linear
        return (
            attn,
            (
                layer.input_layernorm.weight,
                qkv.weight_int4,
                qkv.scales_and_zeros,
            ),
            (
                attn.o_proj.weight_int4,
                attn.o_proj.scales_and_zeros,
                layer.post_attention_layernorm.weight,
                gate_up.weight_int4,
                gate_up.scales_and_zeros,
                mlp.down_proj.weight_int4,
                mlp.down_proj.scales_and_zeros,
            ),
        )

    @torch.inference_mode()
    def forward(self, ids, cache):  # [1, n] -> logits [1, n, vocab]
        past = cache.get_seq_length()
        hidden = self.model.embed_tokens(ids)
        positions = torch.arange(past, past + ids.shape[1]).unsqueeze(0)
        cos, sin = self.model.rotary_emb(hidden, positions)
        for index, (attn, pre_w, post_w) in enumerate(self.layers):
            q, k, v = self.pre(hidden, *pre_w, cos, sin, self.eps, self.head_dim, self.q_heads)
            k, v = cache.update(k, v, index)
            out = rowwise_attention_forward(attn, q, k, v, None, scaling=attn.scaling, dropout=0.0)
            hidden = self.post(hidden, out[0], *post_w, self.eps)
        hidden = self.norm(hidden, self.model.norm.weight, self.eps)
        return self.target.lm_head(hidden)


def main(context: int) -> None:
    torch.manual_seed(0)
    print(f"{machine_fingerprint()['cpu']}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, context {context}")  # fmt: skip
    target = load_target(TARGET, "gguf", attention="rowwise", matmul="auto")
    ids = torch.randint(0, target.info.vocab_size, (1, context + VERIFY))
    eager, fused = LayerLoop(target, False), LayerLoop(target, True)
    engine_loop = target.layer_loop

    def through(loop):  # the target's forward, through `loop` (None: transformers' forward)
        def forward(block, cache):
            target.layer_loop = loop
            return target.forward(block, cache).logits

        return forward

    forwards = {
        "hf": through(None),
        "engine": through(engine_loop),
        "loop": eager.forward,
        "compiled": fused.forward,
    }
    caches = {name: new_cache(target.config) for name in forwards}
    for cache in caches.values():
        target.forward(ids[:, :context], cache, last_logits_only=True)
    start = time.perf_counter()
    for tokens in (1, VERIFY, 2):  # compile (dynamic rows) before timing
        forwards["compiled"](ids[:, context : context + tokens], caches["compiled"])
        crop_cache(caches["compiled"], context)
    print(f"compiled in {time.perf_counter() - start:.1f} s")
    check_rows(forwards, caches, ids, context)
    print("| forward | tokens | ms | vs hf |\n|---|--:|--:|--:|")
    for tokens in (1, VERIFY):
        block = ids[:, context : context + tokens]

        def call(name, block=block):
            return lambda: (forwards[name](block, caches[name]), crop_cache(caches[name], context))

        times = interleaved_ms([call(name) for name in forwards], REPEATS)
        for name, ms in zip(forwards, times, strict=True):
            print(f"| {name} | {tokens} | {ms:.2f} | {times[0] / ms:.2f}x |", flush=True)


def check_rows(forwards, caches, ids, context: int) -> None:
    """Row invariance of each forward (verify rows vs steps, bit for bit) and its distance from
    the target's own logits."""
    block = ids[:, context : context + VERIFY]
    reference = None
    for name, forward in forwards.items():
        cache = caches[name]
        verify = forward(block, cache).float()
        crop_cache(cache, context)
        steps = torch.cat([forward(block[:, i : i + 1], cache).float() for i in range(VERIFY)], 1)
        crop_cache(cache, context)
        reference = steps if reference is None else reference
        same = bool(torch.equal(verify, steps))
        gap = (steps - reference).abs().max().item()
        agree = (steps.argmax(-1) == reference.argmax(-1)).float().mean().item()
        print(f"{name}: verify rows == steps: {same}; max |logit - hf| {gap:.4f}; "
              f"argmax agrees with hf {agree:.0%}")  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
