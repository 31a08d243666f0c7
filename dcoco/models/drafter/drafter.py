"""The DFlash-style parallel block drafter: Qwen3 layers conditioned on tapped target features.

One block is `[anchor, MASK x (block_size - 1)]` at absolute positions `s .. s + block_size - 1`;
one non-causal forward predicts every mask slot at its own position (slot k -> token s + k).
The target's taps are fused once, `ctx = hidden_norm(fc(cat taps))`, and every layer re-projects
that ctx into extra keys/values (`K = rope(k_norm(W_k ctx))`, `V = W_v ctx`: no input_layernorm, no
MLP). Queries come from the block only. This is the math vLLM's `qwen3_dflash` runs, and parameter
names equal the DFlash checkpoint names, so a plain state_dict is a loadable DFlash checkpoint.

The target's embedding (block inputs) and lm_head (logits) are shared and frozen; they are held
outside the module's registry so they never enter the state_dict or the optimizer.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, rotate_half

from dcoco.models.drafter.copy_hints import add_copy_bonus
from dcoco.models.drafter.draft_pass import DraftPass, Product
from dcoco.models.drafter.draft_vocab import DraftVocab
from dcoco.models.drafter.drafter_config import DrafterConfig, check_self_consistent
from dcoco.models.target.cache import cache_length, crop_cache, new_cache


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Neox-style RoPE: x [batch, heads, tokens, head_dim], cos/sin [batch, 1, tokens, head_dim]."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


class DFlashAttention(nn.Module):
    """Block queries attend to [context ; block] keys, bidirectionally (unless a mask says not)."""

    def __init__(self, config: DrafterConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        hidden, heads, kv_heads = config.hidden_size, config.num_heads, config.num_kv_heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _heads(self, x: Tensor) -> Tensor:
        # [batch, tokens, heads * head_dim] -> [batch, heads, tokens, head_dim]
        return x.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)

    def forward(
        self,
        block: Tensor,  # [batch, block, hidden], after input_layernorm
        context: Tensor | None,  # [batch, tokens, hidden], fused taps (not layer-normed)
        cos: Tensor,  # [batch, 1, tokens + block, head_dim]: context positions, then block
        sin: Tensor,
        attention_mask: Tensor | None,  # [batch, 1, block, keys] bool, True = may attend
        cache: DynamicCache | None,
    ) -> Tensor:
        num_block = block.shape[1]
        kv_input = block if context is None else torch.cat([context, block], dim=1)
        query = _rope(
            self.q_norm(self._heads(self.q_proj(block))),
            cos[..., -num_block:, :],
            sin[..., -num_block:, :],
        )  # [batch, heads, block, head_dim]
        key = _rope(self.k_norm(self._heads(self.k_proj(kv_input))), cos, sin)
        value = self._heads(self.v_proj(kv_input))  # [batch, heads, tokens + block, head_dim]
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        # Autocast may leave the normed q/k in fp32 while v is bf16; SDPA needs one dtype.
        key, value = key.to(query.dtype), value.to(query.dtype)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, enable_gqa=True
        )  # [batch, heads, block, head_dim]
        return self.o_proj(out.transpose(1, 2).flatten(2))


class DFlashDecoderLayer(nn.Module):
    """Pre-norm Qwen3 layer over the block; the context only feeds the attention's keys/values."""

    def __init__(self, config: DrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        mlp_dims = SimpleNamespace(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            hidden_act="silu",
        )
        self.mlp = Qwen3MLP(mlp_dims)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden, context, cos, sin, attention_mask, cache) -> Tensor:
        attn = self.self_attn(
            self.input_layernorm(hidden), context, cos, sin, attention_mask, cache
        )
        hidden = hidden + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class BlockDrafter(nn.Module):
    """The drafter. `embed_tokens` and `lm_head` are the target's, frozen and not registered."""

    def __init__(
        self,
        config: DrafterConfig,
        embed_tokens: nn.Embedding,
        lm_head: nn.Module,
        head_dtype: torch.dtype | None = None,  # what lm_head takes; None: the embedding's
    ):
        super().__init__()
        check_self_consistent(config)
        self.config = config
        hidden = config.hidden_size
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_layers))
        self.fc = nn.Linear(config.num_taps * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        # A tuple is not a Module, so nn.Module does not register (save, train or move) these.
        self._shared = (embed_tokens, lm_head)
        self._head_dtype = head_dtype or embed_tokens.weight.dtype
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)  # Qwen3's initializer_range
        self.copy_gate = None
        if config.copy_gate:
            self.add_copy_gate()
        # decoding's head over a subset of rows (dcoco.models.drafter.draft_vocab); None: every row
        self.draft_vocab: DraftVocab | None = None
        # decoding's pass (dcoco.models.drafter.draft_pass), in a tuple so that it is never
        # registered
        self._fast: tuple[DraftPass, ...] = ()
        # True: a draft runs the anchor and the slots it drafts, not the whole block (see draft)
        self.drafted_rows_only = False

    def add_copy_gate(self) -> None:
        """Give the drafter a copy gate (dcoco.models.drafter.copy_hints), zero-initialised so that
        its
        drafts do not change until it is trained."""
        self.config = replace(self.config, copy_hints=True, copy_gate=True)
        self.copy_gate = nn.Linear(self.config.hidden_size, 1).to(self.norm.weight)
        nn.init.zeros_(self.copy_gate.weight)
        nn.init.zeros_(self.copy_gate.bias)

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype  # not a linear's: decoding may swap those for packed ones

    def embed(self, ids: Tensor) -> Tensor:
        """[batch, tokens] ids -> [batch, tokens, hidden] with the target's embedding."""
        return self._shared[0](ids)

    def logits(self, hidden: Tensor, hint_ids: Tensor | None = None) -> Tensor:
        """[batch, slots, hidden] -> [batch, slots, vocab] with the target's lm_head, and the copy
        gate's bonus at the hints `hint_ids` [batch, slots] if the drafter has a gate."""
        head = self._shared[1]
        # 2-D and contiguous: a strided 3-D input (the slots cut out of a block) sends F.linear
        # down a batched-matmul path that copies the whole 49k-row weight on every call.
        rows = hidden.reshape(-1, hidden.shape[-1]).to(self._head_dtype).contiguous()
        return self.copy_logits(head(rows).reshape(*hidden.shape[:-1], -1), hidden, hint_ids)

    def copy_logits(self, logits: Tensor, hidden: Tensor, hint_columns: Tensor | None) -> Tensor:
        """`logits` [batch, slots, vocab'] plus the copy gate's bonus at `hint_columns` [batch,
        slots] (columns of `logits`; negative = no hint); unchanged without a gate or hints."""
        if self.copy_gate is None or hint_columns is None:
            return logits
        rows = hidden.reshape(-1, hidden.shape[-1]).to(self.dtype)
        gate = self.copy_gate  # one output: a matrix-vector product (addmm costs 3x on a CPU)
        bonus = torch.addmv(gate.bias, rows, gate.weight[0]).view(hidden.shape[:-1])
        return add_copy_bonus(logits, bonus.float(), hint_columns)  # bonus: [batch, slots]

    def block_ids(self, anchor: Tensor, hint_ids: Tensor | None = None) -> Tensor:
        """[batch] anchor ids -> [batch, block] ids `[anchor, MASK, ..., MASK]`, with the copy
        hints `hint_ids` [batch, block - 1] (NO_HINT = keep MASK) in the mask slots if given."""
        block = anchor.new_full(
            (anchor.shape[0], self.config.block_size), self.config.mask_token_id
        )
        block[:, 0] = anchor
        if hint_ids is not None:
            block[:, 1:] = torch.where(hint_ids >= 0, hint_ids, block[:, 1:])
        return block

    def _rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [batch, 1, tokens, head_dim] for absolute `positions` [batch, tokens].

        Built in fp32 each call rather than kept as a buffer, which `.to(bf16)` would round.
        """
        half = torch.arange(
            0, self.config.head_dim, 2, device=positions.device, dtype=torch.float32
        )
        inv_freq = 1.0 / self.config.rope_theta ** (half / self.config.head_dim)
        angles = positions[..., None].float() * inv_freq  # [batch, tokens, head_dim / 2]
        angles = torch.cat([angles, angles], dim=-1)[:, None]
        return angles.cos(), angles.sin()

    def forward(
        self,
        block_embeds: Tensor,  # [batch, block, hidden]; several blocks side by side in training
        context: Tensor | None,  # [batch, tokens, taps * hidden] target taps, or None
        context_positions: Tensor | None,  # [batch, tokens] absolute positions of `context`
        block_positions: Tensor,  # [batch, block] absolute positions of the block tokens
        attention_mask: Tensor | None = None,  # [batch, 1, block, cached + tokens + block] bool
        cache: DynamicCache | None = None,  # context K/V of earlier positions, appended to
    ) -> Tensor:
        """Final hidden states [batch, block, hidden] (after `norm`, before the lm_head).

        With a cache, the new context and the block K/V are appended to it; the caller crops.
        """
        hidden = block_embeds.to(self.dtype)
        fused = None
        positions = block_positions
        if context is not None:
            fused = self.hidden_norm(self.fc(context.to(self.dtype)))  # [batch, tokens, hidden]
            positions = torch.cat([context_positions, block_positions], dim=1)
        cos, sin = self._rope_tables(positions)
        for layer in self.layers:
            hidden = layer(hidden, fused, cos, sin, attention_mask, cache)
        return self.norm(hidden)

    def new_cache(self) -> DynamicCache:
        """An empty cache for the context K/V of every draft layer."""
        return new_cache()

    @torch.inference_mode()
    def draft(
        self,
        anchor: Tensor,  # [batch] the last committed token, at position s
        new_features: Tensor,  # [batch, tokens, taps * hidden]: taps at positions c .. s - 1
        cache: DynamicCache,  # context K/V of positions 0 .. c - 1
        num_slots: int | None = None,  # head only the first slots (the rest would go unused)
        hint_ids: Tensor | None = None,  # [batch, block - 1] copy hints (config.copy_hints)
    ) -> tuple[Tensor, Tensor]:
        """Draft the block after `anchor`: fp32 logits [batch, slots, vocab] (over the draft
        vocabulary's N columns where one is set: token_ids() maps them) and hidden states
        [batch, slots, hidden] for the mask slots (positions s + 1 .. s + block_size - 1).

        The cache ends holding context K/V for positions 0 .. s - 1 and never the block's. With
        `drafted_rows_only` the block is the anchor and the `num_slots` masks only, as vLLM runs
        DFlash when it drafts fewer tokens than the block holds (the masks after the last drafted
        slot would be computed and dropped).
        """
        rows = self.config.block_size
        if self.drafted_rows_only and num_slots:
            rows = min(rows, 1 + num_slots)
        block_embeds = self.embed(self.block_ids(anchor, hint_ids)[:, :rows])
        anchor_pos = cache_length(cache) + new_features.shape[1]
        if self._fast and anchor.shape[0] == 1:
            hidden = self._fast[0](block_embeds[0], new_features[0], cache)[None]
        else:
            hidden = self._slot_states(block_embeds, new_features, cache)
        crop_cache(cache, anchor_pos)
        # [batch, slots, hidden]. The 49k-row head is the largest cost of a draft, so it runs on
        # the slots the caller will propose only.
        hidden = hidden[:, :num_slots] if num_slots else hidden
        slot_hints = None if hint_ids is None else hint_ids[:, : hidden.shape[1]]
        vocab = self.draft_vocab
        if vocab is None:
            return self.logits(hidden, slot_hints).float(), hidden
        logits = vocab.logits(hidden)  # [batch, slots, N]: columns, see token_ids()
        return self.copy_logits(logits, hidden, vocab.columns(slot_hints)).float(), hidden

    def _slot_states(self, block_embeds: Tensor, new_features: Tensor, cache) -> Tensor:
        """The module's forward over the block after the new taps: the mask slots' final hidden
        states [batch, rows - 1, hidden] (the anchor's row is dropped)."""
        batch, num_new = new_features.shape[:2]
        start = cache_length(cache)
        positions = torch.arange(start, start + num_new + block_embeds.shape[1],
                                 device=block_embeds.device).expand(batch, -1)  # fmt: skip
        context_positions, block_positions = positions[:, :num_new], positions[:, num_new:]
        hidden = self.forward(
            block_embeds, new_features, context_positions, block_positions, cache=cache
        )
        return hidden[:, 1:]

    def use_draft_pass(self, draft_pass: DraftPass | None) -> None:
        """Draft single sequences through `draft_pass` (built from this drafter's weights) from now
        on; None: through the module's forward."""
        self._fast = () if draft_pass is None else (draft_pass,)

    def use_draft_vocab(self, token_ids: Tensor | None, product: Product | None = None) -> None:
        """Draft over the LM head's rows of `token_ids` only (None: every row) from now on, on
        `product`'s layer (a weight -> a layer; None: the rows as they are)."""
        if token_ids is None:
            self.draft_vocab = None
            return
        head, device = self._shared[1], self.norm.weight.device
        vocab_size = self.config.vocab_size
        self.draft_vocab = DraftVocab(
            head, token_ids.to(device), vocab_size, self._head_dtype, product
        )

    def token_ids(self, columns: Tensor) -> Tensor:
        """Columns of `draft()`'s logits -> token ids (the same unless a draft vocab is set)."""
        return columns if self.draft_vocab is None else self.draft_vocab.token_ids[columns]
