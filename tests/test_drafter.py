"""The block drafter: config rules, the exact DFlash math, and training == inference."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import (
    DrafterConfig,
    build_target_layer_ids,
    check_compatible,
)
from dcoco.train.blocks import block_attention_mask, block_inputs_and_labels

TAPS = (0, 1, 3)
BLOCK = 5
SEQ = 40


def make_drafter(target, seed: int = 0) -> BlockDrafter:
    config = DrafterConfig.for_target(
        target, block_size=BLOCK, mask_token_id=3, target_layer_ids=TAPS
    )
    torch.manual_seed(seed)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    with torch.no_grad():  # non-trivial norms, so a wrong norm placement shows
        for name, param in drafter.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return drafter.eval()


@pytest.fixture
def setup(tiny_llama_target):
    target = tiny_llama_target
    ids = torch.randint(4, 128, (1, SEQ), generator=torch.Generator().manual_seed(1))
    features = target.forward(ids, feature_layers=TAPS, with_logits=False).features.clone()
    return target, make_drafter(target), ids, features


def training_forward(drafter, ids, features, anchors):
    """The training path: all blocks side by side under the block mask."""
    anchors = torch.tensor([anchors])
    block_ids, positions, _ = block_inputs_and_labels(ids, anchors, BLOCK, 3)
    mask = block_attention_mask(anchors, ids.shape[1], BLOCK)
    context_positions = torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        hidden = drafter(drafter.embed(block_ids), features, context_positions, positions, mask)
    return hidden.view(1, -1, BLOCK, hidden.shape[-1])  # [batch, n, block, hidden]


def test_tap_rule_matches_dflash():
    assert build_target_layer_ids(30, 3) == (1, 14, 27)  # SmolLM2-135M
    assert build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B DFlash
    assert build_target_layer_ids(30, 1) == (15,)


def test_for_target_copies_smollm2_dims():
    smollm2 = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
        max_position_embeddings=8192,
    )  # fmt: skip
    config = DrafterConfig.for_target(smollm2, mask_token_id=16)
    assert config.target_layer_ids == (1, 14, 27)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (9, 3, 64)
    assert (config.intermediate_size, config.rope_theta, config.rms_norm_eps) == (1536, 1e5, 1e-5)
    assert (config.num_layers, config.block_size, config.num_target_layers) == (2, 16, 30)
    with pytest.raises(DcocoError, match="mask token"):
        DrafterConfig.for_target(smollm2)


def test_state_dict_has_dflash_names_only(setup):
    _, drafter, _, _ = setup
    per_layer = [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
        "input_layernorm", "post_attention_layernorm",
    ]  # fmt: skip
    expected = {f"layers.{i}.{name}.weight" for i in range(2) for name in per_layer}
    expected |= {"fc.weight", "hidden_norm.weight", "norm.weight"}
    assert set(drafter.state_dict()) == expected
    assert drafter.fc.weight.shape == (64, 3 * 64)


def reference_draft(drafter, ids, features, anchor_pos):
    """The math vLLM's qwen3_dflash runs, written out with HF's own Qwen3 RoPE and eager
    attention: ctx = hidden_norm(fc(taps)); K_ctx = rope(k_norm(Wk ctx)), V_ctx = Wv ctx."""
    config = drafter.config
    hf = Qwen3Config(
        hidden_size=config.hidden_size, num_attention_heads=config.num_heads,
        head_dim=config.head_dim, rope_parameters={"rope_type": "default",
                                                   "rope_theta": config.rope_theta},
    )  # fmt: skip
    rotary = Qwen3RotaryEmbedding(hf)
    block_ids = torch.full((1, BLOCK), 3)
    block_ids[0, 0] = ids[0, anchor_pos]
    h = drafter.embed(block_ids)
    ctx = drafter.hidden_norm(drafter.fc(features[:, :anchor_pos]))
    positions = torch.arange(anchor_pos + BLOCK)[None]
    cos, sin = rotary(h, positions)
    groups = config.num_heads // config.num_kv_heads
    for layer in drafter.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)

        def heads(t):
            return t.view(1, t.shape[1], -1, config.head_dim).transpose(1, 2)

        q = attn.q_norm(heads(attn.q_proj(x)))
        k = attn.k_norm(heads(attn.k_proj(torch.cat([ctx, x], dim=1))))
        v = heads(attn.v_proj(torch.cat([ctx, x], dim=1)))
        q, _ = apply_rotary_pos_emb(q, q, cos[:, -BLOCK:], sin[:, -BLOCK:])
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        scores = q @ repeat_kv(k, groups).transpose(2, 3) * config.head_dim**-0.5
        out = scores.softmax(-1) @ repeat_kv(v, groups)  # no mask: fully bidirectional
        h = h + attn.o_proj(out.transpose(1, 2).flatten(2))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return drafter.norm(h)[:, 1:]


def test_draft_equals_reference_math(setup):
    _, drafter, ids, features = setup
    _, hidden = drafter.draft(ids[:, 17], features[:, :17], drafter.new_cache())
    with torch.no_grad():
        expected = reference_draft(drafter, ids, features, 17)
    torch.testing.assert_close(hidden, expected, atol=1e-5, rtol=1e-5)


def test_training_forward_equals_inference_draft(setup):
    """Two blocks trained side by side == two successive draft() calls over a cache."""
    _, drafter, ids, features = setup
    trained = training_forward(drafter, ids, features, [12, 25])
    cache = drafter.new_cache()
    logits_1, hidden_1 = drafter.draft(ids[:, 12], features[:, :12], cache)
    assert cache.get_seq_length() == 12  # context only: the block's K/V were cropped
    logits_2, hidden_2 = drafter.draft(ids[:, 25], features[:, 12:25], cache)
    assert cache.get_seq_length() == 25
    torch.testing.assert_close(trained[:, 0, 1:], hidden_1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(trained[:, 1, 1:], hidden_2, atol=1e-5, rtol=1e-5)
    assert logits_2.shape == (1, BLOCK - 1, 128) and logits_2.dtype == torch.float32
    torch.testing.assert_close(logits_2, drafter.logits(hidden_2).float())


def test_training_mask_hides_anchor_feature_and_later_context(setup):
    """Would fail with `<=`: the anchor's own feature does not exist at inference time."""
    _, drafter, ids, features = setup
    anchors = [12, 25]
    base = training_forward(drafter, ids, features, anchors)

    def perturbed(position):
        changed = features.clone()
        changed[:, position] += 5.0
        return training_forward(drafter, ids, changed, anchors)

    torch.testing.assert_close(perturbed(12)[:, 0], base[:, 0])  # the anchor itself: hidden
    torch.testing.assert_close(perturbed(20)[:, 0], base[:, 0])  # later context: hidden
    assert not torch.allclose(perturbed(11)[:, 0], base[:, 0])  # just before: visible
    assert not torch.allclose(perturbed(20)[:, 1], base[:, 1])  # inside block 2's context


def test_blocks_do_not_see_each_other(setup):
    _, drafter, ids, features = setup
    base = training_forward(drafter, ids, features, [12, 25])
    other = ids.clone()
    other[0, 25] = (other[0, 25] + 1) % 128  # block 2's anchor token
    moved = training_forward(drafter, other, features, [12, 25])
    torch.testing.assert_close(moved[:, 0], base[:, 0])
    assert not torch.allclose(moved[:, 1], base[:, 1])


def test_check_compatible_names_the_mismatch(setup):
    target, drafter, _, _ = setup
    check_compatible(drafter.config, target.info, fingerprint=target.info.fingerprint)
    with pytest.raises(DcocoError, match="fingerprint"):
        check_compatible(drafter.config, target.info, fingerprint="0" * 16)
    wrong_taps = DrafterConfig.for_target(target, mask_token_id=3, target_layer_ids=(0, 4))
    with pytest.raises(DcocoError, match=r"taps \[4\]"):
        check_compatible(wrong_taps, target.info)
