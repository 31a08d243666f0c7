"""Target precisions: weight-only int8 and the attention kernel choice
(dcoco.models.target.precision)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_target
from torch import nn

from dcoco.decode.engine import Engine
from dcoco.decode.proposers import PromptLookupProposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.precision import (
    Int8WeightLinear,
    check_precision,
    quantise_int8_weights,
    resolve_attention,
)
from dcoco.models.target.target import TargetModel

pytestmark = pytest.mark.usefixtures("one_thread")


def int8_target() -> TargetModel:
    """The tiny Llama in bf16, eager attention, every linear (the head too) int8."""
    fp32 = make_tiny_target("llama")
    model = fp32.model.to(torch.bfloat16)
    model.set_attn_implementation("eager")
    quantise_int8_weights(model)
    return TargetModel(model, name="tiny-int8", precision="int8", attention="eager")


def test_int8_linear_is_the_rounded_weight():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32, bias=True)
    quantised = Int8WeightLinear(linear)
    x = torch.randn(5, 64)
    scale = linear.weight.abs().amax(1, keepdim=True) / 127
    rounded = (linear.weight / scale).round() * scale  # what int8 can represent, row by row
    expected = x @ rounded.T + linear.bias
    got = quantised(x.bfloat16()).float()
    assert torch.allclose(got, expected, atol=0.05, rtol=0.02)
    assert quantised.weight_int8.dtype == torch.int8
    assert (quantised.weight_int8.abs().amax(1) == 127).all()  # the full range is used per row


def test_every_linear_and_the_head_are_quantised():
    target = int8_target()
    linears = [m for m in target.model.modules() if isinstance(m, nn.Linear)]
    assert linears == []
    assert isinstance(target.lm_head, Int8WeightLinear)
    assert target.embed_tokens.weight.dtype == torch.bfloat16  # the lookup keeps its rows


def test_int8_verify_rows_equal_single_steps():
    """Weight-only int8 rounds no activation, so each row of a k-token forward is the 1-token
    step's logits bit for bit; this is what makes speculation lossless at int8."""
    target = int8_target()
    prompt = torch.randint(5, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    block = torch.randint(5, 128, (1, 6), generator=torch.Generator().manual_seed(2))
    cache = target.new_cache()
    target.forward(prompt, cache, last_logits_only=True)
    together = target.forward(block, cache).logits
    crop_cache(cache, 20)
    one_by_one = torch.cat([target.forward(block[:, i : i + 1], cache).logits for i in range(6)], 1)
    assert torch.equal(together, one_by_one)


def test_int8_speculative_output_equals_int8_plain():
    target = int8_target()
    config = DrafterConfig.for_target(target, num_layers=1, block_size=5, mask_token_id=3,
                                      target_layer_ids=(0, 1, 3))  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head).to(torch.bfloat16)
    from dcoco.decode.dflash_proposer import DFlashProposer

    for seed in range(3):
        prompt = torch.randint(5, 128, (10,), generator=torch.Generator().manual_seed(seed))
        plain = Engine(target).generate(prompt.tolist(), 40)
        for proposer in (PromptLookupProposer(6), DFlashProposer(drafter)):
            assert Engine(target, proposer).generate(prompt.tolist(), 40).new_ids == plain.new_ids


def test_precision_and_attention_names():
    assert check_precision("int8") == "int8"
    with pytest.raises(DcocoError, match="unknown dtype 'int4'"):
        check_precision("int4")
    assert resolve_attention("auto", "int8") == "rowwise"
    assert resolve_attention("auto", "bf16", torch.device("cpu")) == "rowwise"
    assert resolve_attention("auto", "bf16", torch.device("cuda")) == "sdpa"
    assert resolve_attention("eager", "bf16") == "eager"
    with pytest.raises(DcocoError, match="unknown attention"):
        resolve_attention("flash", "bf16")


def test_drafter_logits_of_strided_slots_equal_contiguous():
    """`logits` of slots cut out of a block (a strided view) equal those of a copy; the 2-D path
    exists for speed (a strided 3-D input copied the whole head weight on every draft)."""
    target = make_tiny_target("llama")
    config = DrafterConfig.for_target(target, num_layers=1, block_size=6, mask_token_id=3,
                                      target_layer_ids=(0, 1, 3))  # fmt: skip
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    hidden = torch.randn(2, 6, 64)[:, 1:4]  # [batch, slots, hidden], not contiguous
    assert not hidden.is_contiguous()
    expected = hidden.contiguous() @ target.lm_head.weight.T
    assert torch.allclose(drafter.logits(hidden), expected, atol=1e-5)


def test_an_int8_bench_report_says_it_is_a_different_target():
    from dcoco.eval.report import INT8_NOTE, _setup

    session = {"target": "t", "dtype": "int8", "device": "cpu", "cpu": "c", "torch_threads": 2,
               "started": "now", "git_commit": "abc"}  # fmt: skip
    config = {"config": {"max_new_tokens": 8, "limit": 1, "chat": True}, "sessions": [session]}
    summary = {"methods": ["plain"], "baseline": "plain"}
    assert INT8_NOTE in _setup(summary, config)
    assert INT8_NOTE not in _setup(summary, {**config, "sessions": [{**session, "dtype": "bf16"}]})
