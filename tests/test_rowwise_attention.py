"""The rowwise attention kernel (dcoco.models.target.rowwise_attention): verify rows equal single
steps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_target

import dcoco.models.target.rowwise_attention as rowwise_attention
from dcoco.decode.engine import Engine
from dcoco.decode.proposers import PromptLookupProposer
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.rowwise_attention import ROWWISE
from dcoco.models.target.target import TargetModel

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(kernel: str, dtype=torch.bfloat16) -> TargetModel:
    model = make_tiny_target("llama").model.to(dtype)
    model.set_attn_implementation(kernel)
    return TargetModel(model, name="tiny", attention=kernel)


def block_and_steps(target: TargetModel, context: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 128, (1, context + k), generator=torch.Generator().manual_seed(context))
    cache = target.new_cache()
    target.forward(ids[:, :context], cache, last_logits_only=True)
    together = target.forward(ids[:, context:], cache).logits
    crop_cache(cache, context)
    steps = [target.forward(ids[:, context + i : context + i + 1], cache).logits for i in range(k)]
    return together, torch.cat(steps, 1)


@pytest.mark.parametrize("context,k", [(3, 2), (17, 5), (40, 8)])
def test_rowwise_block_equals_steps_bit_for_bit(context, k):
    together, steps = block_and_steps(tiny(ROWWISE), context, k)
    assert torch.equal(together, steps)


def test_rowwise_computes_the_same_attention_as_sdpa():
    """Same math, other blocking: fp32 outputs agree to rounding, prefill included."""
    rowwise, sdpa = tiny(ROWWISE, torch.float32), tiny("sdpa", torch.float32)
    ids = torch.randint(5, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    caches = rowwise.new_cache(), sdpa.new_cache()
    for start, end in ((0, 24), (24, 30)):  # a prefill, then a 6-token verify over the cache
        a = rowwise.forward(ids[:, start:end], caches[0]).logits
        b = sdpa.forward(ids[:, start:end], caches[1]).logits
        assert torch.allclose(a, b, atol=1e-4)


def test_bf16_prompt_lookup_equals_plain_with_rowwise():
    """At bf16, where SDPA's verify may round otherwise than its step, the rowwise kernel makes
    greedy speculative output equal plain decoding's."""
    target = tiny(ROWWISE)
    for seed in range(3):
        prompt = torch.randint(5, 128, (12,), generator=torch.Generator().manual_seed(seed))
        plain = Engine(target).generate(prompt.tolist(), 48).new_ids
        lookup = Engine(target, PromptLookupProposer(6)).generate(prompt.tolist(), 48)
        assert lookup.new_ids == plain


@pytest.mark.parametrize("amx", [False, True])  # no AMX: the fp32 product; else SDPA
@pytest.mark.parametrize("context,k", [(3, 2), (40, 8)])
def test_half_precision_rows_equal_steps_on_either_path(monkeypatch, amx, context, k):
    monkeypatch.setattr(rowwise_attention, "amx_bf16", lambda: amx)
    calls = []
    monkeypatch.setattr(rowwise_attention, "sdpa_attention_forward", counting(calls))
    together, steps = block_and_steps(tiny(ROWWISE), context, k)
    assert torch.equal(together, steps)
    assert (1 in calls) == amx  # one-query rows went where the machine sends them


def test_the_fp32_product_is_sdpas_attention_rounded_once(monkeypatch):
    """GQA grouping and scale as SDPA has them: the fp32 product of bf16 rows equals SDPA's fp32
    attention over the same (upcast) inputs, then rounded to bf16."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 6, 1, 16, generator=generator).bfloat16()
    key, value = (torch.randn(1, 2, 37, 16, generator=generator).bfloat16() for _ in range(2))
    monkeypatch.setattr(rowwise_attention, "amx_bf16", lambda: False)
    module = SimpleNamespace(num_key_value_groups=3, training=False, is_causal=True)
    kwargs = {"scaling": 0.25, "dropout": 0.0}
    ours = rowwise_attention.one_query(module, query, key, value, kwargs)  # [1, 1, heads, dim]
    expected = F.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), scale=0.25, enable_gqa=True
    ).transpose(1, 2)
    assert ours.dtype == torch.bfloat16 and ours.shape == (1, 1, 6, 16)
    assert torch.allclose(ours.float(), expected, atol=1e-5, rtol=2**-8)


def test_the_fp32_product_only_takes_what_it_computes(monkeypatch):
    monkeypatch.setattr(rowwise_attention, "amx_bf16", lambda: False)
    half, full = torch.zeros(1, 4, 1, 8).bfloat16(), torch.zeros(1, 4, 1, 8)
    plain = {"scaling": 0.3, "dropout": 0.0, "position_ids": None}
    assert rowwise_attention.fp32_math_pays(half, plain)
    assert not rowwise_attention.fp32_math_pays(full, plain)  # fp32 rows keep SDPA
    assert not rowwise_attention.fp32_math_pays(half, {**plain, "sliding_window": 16})
    assert not rowwise_attention.fp32_math_pays(half, {**plain, "dropout": 0.1})
    monkeypatch.setattr(rowwise_attention, "amx_bf16", lambda: True)
    assert not rowwise_attention.fp32_math_pays(half, plain)


def counting(calls: list):
    real = rowwise_attention.sdpa_attention_forward

    def forward(*args, **kwargs):
        calls.append(args[1].shape[2])  # query rows
        return real(*args, **kwargs)

    return forward
