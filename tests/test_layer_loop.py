"""The decoding layer loop (dcoco.models.target.layer_loop): bit-equal to the model's forward."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_DIMS, make_tiny_target
from test_gguf_weights import tiny_gguf_target
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dcoco.models.target.cache import crop_cache
from dcoco.models.target.int4_dot import Int4DotLinear, int4_dot_available
from dcoco.models.target.layer_loop import layer_loop_for
from dcoco.models.target.precision import quantise_int8_weights
from dcoco.models.target.rowwise_attention import MAX_ROWWISE_QUERIES, ROWWISE
from dcoco.models.target.target import TargetModel

pytestmark = pytest.mark.usefixtures("one_thread")
CONTEXT, TAPS = 20, (0, 2, 3)


def tiny(arch: str, dtype=torch.float32, kernel: str = ROWWISE, int8: bool = False) -> TargetModel:
    if arch == "qwen2":
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(**TINY_DIMS))
    else:
        model = make_tiny_target(arch).model
    model = model.to(dtype).eval()
    model.set_attn_implementation(kernel)
    if int8:
        quantise_int8_weights(model)
    return TargetModel(model, name=f"tiny-{arch}")


def loop_and_model(target: TargetModel, tokens: int, taps=TAPS):
    """The same call after the same prefill, through the loop and through the model's forward;
    also fails if the loop did not take the call."""
    ids = torch.randint(5, 128, (1, CONTEXT + tokens), generator=torch.Generator().manual_seed(3))
    block, loop = ids[:, CONTEXT:], target.layer_loop
    results, caches = [], []
    for use_loop in (True, False):
        target.layer_loop = loop if use_loop else None
        cache = target.new_cache()
        target.forward(ids[:, :CONTEXT], cache, last_logits_only=True)
        assert not use_loop or loop.takes(block, cache, None)
        results.append(target.forward(block, cache, feature_layers=taps))
        caches.append(cache)
    target.layer_loop = loop
    return results, caches


def assert_bit_equal(results, caches) -> None:
    (fast, model), (fast_cache, model_cache) = results, caches
    assert torch.equal(fast.logits, model.logits)
    assert (fast.features is None and model.features is None) or torch.equal(
        fast.features, model.features
    )
    for fast_layer, model_layer in zip(fast_cache.layers, model_cache.layers, strict=True):
        assert torch.equal(fast_layer.keys, model_layer.keys)
        assert torch.equal(fast_layer.values, model_layer.values)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tokens", [1, 5])
def test_steps_and_verifies_equal_the_models_forward(arch, tokens):
    target = tiny(arch)
    assert target.layer_loop is not None
    assert_bit_equal(*loop_and_model(target, tokens))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precisions_equal_the_models_forward(dtype):
    assert_bit_equal(*loop_and_model(tiny("llama", dtype), 4))


def test_int8_and_gguf_layers_equal_the_models_forward():
    assert_bit_equal(*loop_and_model(tiny("llama", torch.bfloat16, int8=True), 4))
    gguf = tiny_gguf_target()
    # gguf's q/k/v are one product: q and k rotate as one tensor (layer_loop._rotated_qkv)
    assert all(calls.qkv_joint is not None for calls in gguf.layer_loop.layers)
    for tokens in (1, 6):
        assert_bit_equal(*loop_and_model(gguf, tokens))
    if int4_dot_available():  # gguf-a8: its layers' forward calls the w4a8 kernel
        gguf_a8 = tiny_gguf_target(layer=Int4DotLinear)
        for tokens in (1, 6):
            assert_bit_equal(*loop_and_model(gguf_a8, tokens))


def test_sdpa_takes_single_token_steps_only():
    target = tiny("llama", kernel="sdpa")
    assert_bit_equal(*loop_and_model(target, 1, taps=()))
    cache = target.new_cache()
    target.forward(torch.tensor([[5, 6, 7]]), cache)
    assert not target.layer_loop.takes(torch.tensor([[8, 9]]), cache, None)


def test_the_model_forward_serves_prefills_batches_masks_and_long_blocks():
    loop = tiny("llama").layer_loop
    target = tiny("llama")
    cache = target.new_cache()
    prompt = torch.tensor([[5, 6, 7]])
    assert not loop.takes(prompt, cache, None)  # a prefill: nothing cached yet
    assert not loop.takes(prompt, None, None)
    target.forward(prompt, cache)
    assert loop.takes(torch.full((1, MAX_ROWWISE_QUERIES), 5), cache, None)
    assert not loop.takes(torch.full((1, MAX_ROWWISE_QUERIES + 1), 5), cache, None)
    assert not loop.takes(torch.full((2, 1), 5), cache, None)
    assert not loop.takes(torch.full((1, 1), 5), cache, torch.ones(1, 4))


def test_models_the_loop_does_not_reproduce_keep_their_forward():
    assert tiny("llama", kernel="eager").layer_loop is None
    torch.manual_seed(0)
    windowed = MistralForCausalLM(MistralConfig(**TINY_DIMS, sliding_window=8))
    windowed.set_attn_implementation(ROWWISE)
    assert layer_loop_for(windowed) is None
    windowed.config.sliding_window = None
    assert layer_loop_for(windowed) is not None


def test_a_decode_through_the_loop_commits_what_the_model_forward_commits():
    """Greedy steps over a growing cache, cropped back as a rejected draft would be."""
    target = tiny("llama", torch.bfloat16)
    outputs = []
    for loop in (target.layer_loop, None):
        target.layer_loop = loop
        cache, tokens = target.new_cache(), [5, 9, 11, 7]
        logits = target.forward(torch.tensor([tokens]), cache, last_logits_only=True).logits
        for _ in range(12):
            tokens.append(int(logits[0, -1].argmax()))
            block = torch.tensor([tokens[-1:] * 3])  # a 3-token "verify", two rows rejected
            logits = target.forward(block, cache).logits[:, :1]
            crop_cache(cache, len(tokens))
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
