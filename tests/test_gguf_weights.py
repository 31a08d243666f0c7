"""Precision gguf: Q4_1 codes run through torch's int4 CPU kernel
(dcoco.models.target.gguf_weights)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_tiny_target

from dcoco.errors import DcocoError
from dcoco.models.target import gguf_weights
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.gguf_weights import (
    GROUP,
    Int4GroupLinear,
    _check_same_weight,
    _hf_row_order,
    dequantise,
    install_int4,
    q4_1_blocks,
)
from dcoco.models.target.int4_dot import Int4DotLinear, int4_dot_available
from dcoco.models.target.precision import resolve_attention
from dcoco.models.target.rowwise_attention import MAX_ROWWISE_QUERIES, hf_attention
from dcoco.models.target.shared_input import OutputSlice
from dcoco.models.target.target import TargetModel

pytestmark = pytest.mark.usefixtures("one_thread")


def q4_1_bytes(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random Q4_1 blocks as a GGUF stores them: [rows, cols / 32 * 20] bytes."""
    rng = np.random.default_rng(seed)
    groups = rows * cols // GROUP
    d = rng.uniform(0.001, 0.05, groups).astype(np.float16).view(np.uint8).reshape(groups, 2)
    m = rng.uniform(-0.2, 0.0, groups).astype(np.float16).view(np.uint8).reshape(groups, 2)
    codes = rng.integers(0, 256, (groups, 16), dtype=np.uint8)
    return np.concatenate([d, m, codes], axis=1).reshape(rows, -1)


def test_q4_1_blocks_dequantise_like_gguf():
    import gguf

    raw = q4_1_bytes(8, 64)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1)  # [8, 64]
    codes, scale, zero = q4_1_blocks(raw, 8, 64)
    assert codes.shape == (8, 64) and int(codes.min()) >= 0 and int(codes.max()) <= 15
    assert torch.allclose(dequantise(codes, scale, zero), torch.from_numpy(expected), atol=1e-6)


def test_int4_linear_computes_the_dequantised_weight():
    codes, scale, zero = q4_1_blocks(q4_1_bytes(48, 64), 48, 64)
    bias = torch.randn(48)
    linear = Int4GroupLinear(codes, scale, zero, bias)
    x = torch.randn(3, 5, 64)
    # the kernel's one rounding: scale and zero in bf16
    weight = dequantise(codes, scale.bfloat16().float(), zero.bfloat16().float())
    expected = x.bfloat16().float() @ weight.T + bias.bfloat16().float()
    got = linear(x)
    assert got.shape == (3, 5, 48) and got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), expected, atol=0.03, rtol=0.02)


def test_int4_rows_of_a_block_equal_single_rows():
    """What makes the verify round like the step: row i of a k-row product is the 1-row product."""
    codes, scale, zero = q4_1_blocks(q4_1_bytes(64, 128, seed=3), 64, 128)
    linear = Int4GroupLinear(codes, scale, zero)
    x = torch.randn(9, 128).bfloat16()
    assert torch.equal(linear(x), torch.cat([linear(x[i : i + 1]) for i in range(9)]))


@pytest.mark.parametrize("native", [True, False])
def test_prefills_run_the_dequantised_copy(monkeypatch, native):
    """Inputs longer than a verify (prefills) take the dequantised weights, bf16 where the CPU
    computes it natively, else fp32; steps and verifies keep the int4 kernel."""
    monkeypatch.setattr(gguf_weights, "native_bf16", lambda: native)
    codes, scale, zero = q4_1_blocks(q4_1_bytes(48, 64, seed=5), 48, 64)
    linear = Int4GroupLinear(codes, scale, zero)
    assert linear.prefill_dtype == (torch.bfloat16 if native else torch.float32)
    weight = dequantise(codes, scale.bfloat16().float(), zero.bfloat16().float())
    prompt = torch.randn(MAX_ROWWISE_QUERIES + 1, 64).bfloat16()
    calls = []
    monkeypatch.setattr(gguf_weights, "int4_rows", lambda *args: calls.append(1) or args[0][:, :48])
    got = linear(prompt)
    assert not calls and got.dtype == torch.bfloat16
    expected = (prompt.to(linear.prefill_dtype) @ weight.to(linear.prefill_dtype).T).bfloat16()
    assert torch.equal(got, expected)
    linear(prompt[:MAX_ROWWISE_QUERIES])
    assert calls == [1]


def test_q_and_k_rows_return_to_hf_order():
    """The GGUF converter interleaves each head's rotary halves; the order undoes it (as
    transformers does when it dequantises the file)."""

    class Config:
        num_attention_heads, num_key_value_heads = 2, 1

    order = _hf_row_order("attn_q", 8, Config)
    assert order.tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert _hf_row_order("attn_k", 4, Config).tolist() == [0, 2, 1, 3]
    assert _hf_row_order("ffn_up", 4, Config).tolist() == [0, 1, 2, 3]


def test_a_gguf_of_another_model_is_refused():
    codes, scale, zero = q4_1_blocks(q4_1_bytes(8, 64), 8, 64)
    weight = dequantise(codes, scale, zero)
    _check_same_weight("w", codes, scale, zero, weight.bfloat16())  # its own weight passes
    with pytest.raises(DcocoError, match="does not match"):
        _check_same_weight("w", codes, scale, zero, weight.flip(0))


def tiny_gguf_target(fuse: bool = True, layer=Int4GroupLinear) -> TargetModel:
    """A tiny Llama with every decoder linear on random int4 codes (as `layer`: gguf's, or
    gguf-a8's Int4DotLinear) and the rowwise attention (auto's choice on CPU); `fuse` runs q/k/v
    and gate/up as shared products, as loading does."""
    model = make_tiny_target("llama").model.to(torch.bfloat16)
    model.set_attn_implementation(hf_attention(resolve_attention("auto", "gguf")))
    codes_of = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and name.startswith("model.layers."):
            rows, cols = module.out_features, module.in_features
            seed = rows + cols + len(codes_of)
            codes_of[name] = (*q4_1_blocks(q4_1_bytes(rows, cols, seed), rows, cols), None)
    if fuse:
        install_int4(model, codes_of, layer)
    else:
        for name, (codes, scale, zero, _) in codes_of.items():
            model.set_submodule(name, layer(codes, scale, zero))
    precision = "gguf" if layer is Int4GroupLinear else "gguf-a8"
    return TargetModel(model, name="tiny-gguf", precision=precision, attention="rowwise")


GGUF_LAYERS = [
    Int4GroupLinear,
    pytest.param(
        Int4DotLinear,
        marks=pytest.mark.skipif(not int4_dot_available(), reason="no int4_dot build"),
    ),
]


@pytest.mark.parametrize("layer", GGUF_LAYERS)
def test_gguf_verify_rows_equal_single_steps(layer):
    """The logits of a k-token forward equal k one-token steps bit for bit (gguf and gguf-a8)."""
    target = tiny_gguf_target(layer=layer)
    assert isinstance(target.layers[0].self_attn.k_proj, OutputSlice)
    prompt = torch.randint(5, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    block = torch.randint(5, 128, (1, 6), generator=torch.Generator().manual_seed(2))
    cache = target.new_cache()
    target.forward(prompt, cache, last_logits_only=True)
    together = target.forward(block, cache).logits
    crop_cache(cache, 20)
    one_by_one = torch.cat([target.forward(block[:, i : i + 1], cache).logits for i in range(6)], 1)
    assert torch.equal(together, one_by_one)


@pytest.mark.parametrize("layer", GGUF_LAYERS)
def test_fused_projections_compute_the_separate_layers(layer):
    """q/k/v and gate/up as one product: the same logits as one kernel call per layer."""
    ids = torch.randint(5, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    fused = tiny_gguf_target(fuse=True, layer=layer).forward(ids).logits
    separate = tiny_gguf_target(fuse=False, layer=layer).forward(ids).logits
    assert torch.equal(fused, separate)
