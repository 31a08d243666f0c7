"""The rowwise attention kernel (dcoco.models.rowwise_attention): verify rows equal single steps."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_target

from dcoco.decode.engine import Engine
from dcoco.decode.proposers import PromptLookupProposer
from dcoco.models.cache import crop_cache
from dcoco.models.rowwise_attention import ROWWISE
from dcoco.models.target import TargetModel

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
