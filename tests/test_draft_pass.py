"""The drafter's decoding pass (dcoco.models.drafter.draft_pass): the module's arithmetic bit for
bit, a block cut to the drafted slots (`--draft-block drafted`) and int4 products
(`--draft-dtype int4`, dcoco.models.target.int4_groups); decoding with either stays plain's."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_target

import dcoco.decode.draft_precision as draft_precision
from dcoco.decode.draft_precision import check_draft_block, drafter_product
from dcoco.decode.engine import Engine
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.draft_pass import CATCH_UP_ROWS, DraftPass
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import save_drafter
from dcoco.models.target import int4_dot
from dcoco.models.target.gguf_weights import GROUP, dequantise
from dcoco.models.target.int4_dot import int4_dot_available, w4a8_linear
from dcoco.models.target.int4_groups import int4_linear, quantise_int4

pytestmark = pytest.mark.usefixtures("one_thread")
TAPS = (0, 1, 3)


def make_drafter(target, block: int = 6) -> BlockDrafter:
    config = DrafterConfig.for_target(target, block_size=block, mask_token_id=3,
                                      target_layer_ids=TAPS)  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    drafter.add_copy_gate()
    with torch.no_grad():  # norms away from 1 and a live copy gate, so a misplaced one shows
        for name, param in drafter.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
        drafter.copy_gate.weight.normal_()
    return drafter.eval().to(target.dtype)


def cycles(drafter, features, slots: int):
    """Three draft cycles over one cache (a prefill, then 3 and 2 new taps): each cycle's logits
    and hidden states, and the cache's keys and values after each."""
    cache, out = drafter.new_cache(), []
    for start, stop in ((0, 12), (12, 15), (15, 17)):
        anchor = torch.tensor([5 + stop])
        hints = torch.tensor([[7, -1, 9, -1, 11]])
        logits, hidden = drafter.draft(anchor, features[:, start:stop], cache, slots, hints)
        kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        out.append((logits, hidden, kv))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("drafted", [False, True])
def test_the_pass_is_the_modules_arithmetic(dtype, drafted):
    target = make_tiny_target("llama")
    target.model.to(dtype)
    drafter = make_drafter(target)
    drafter.drafted_rows_only = drafted
    features = torch.randn(1, 17, 3 * 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    module = cycles(drafter, features, slots=3)
    drafter.use_draft_pass(DraftPass(drafter))
    fast = cycles(drafter, features, slots=3)
    # the last layer runs the slots' rows only: products over fewer rows may round differently
    close = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.05, rtol=0.02)
    for (logits, hidden, kv), (fast_logits, fast_hidden, fast_kv) in zip(module, fast, strict=True):
        assert torch.allclose(logits, fast_logits, **close)
        assert torch.allclose(hidden.float(), fast_hidden.float(), **close)
        for (keys, values), (fast_keys, fast_values) in zip(kv, fast_kv, strict=True):
            assert torch.equal(keys, fast_keys) and torch.equal(values, fast_values)
    assert [kv[0][0].shape[-2] for *_, kv in fast] == [12, 15, 17]  # the block's cropped out


def test_a_drafted_block_is_the_anchor_and_the_drafted_masks():
    target = make_tiny_target("llama")
    drafter = make_drafter(target)
    features = torch.randn(1, 9, 3 * 64, generator=torch.Generator().manual_seed(3))
    anchor = torch.tensor([40])
    full, _ = drafter.draft(anchor, features, drafter.new_cache(), num_slots=2)
    drafter.drafted_rows_only = True
    cut, _ = drafter.draft(anchor, features, drafter.new_cache(), num_slots=2)
    # what a drafter trained on blocks of 3 would compute: [anchor, MASK, MASK] after the context
    positions = torch.arange(9)[None]
    with torch.no_grad():
        hidden = drafter(drafter.embed(torch.tensor([[40, 3, 3]])), features, positions,
                         torch.arange(9, 12)[None])  # fmt: skip
    assert torch.equal(cut, drafter.logits(hidden[:, 1:]).float())
    assert not torch.equal(cut, full)  # the later masks are seen by the full block's slots


def test_int4_groups_round_to_the_nearest_code():
    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(4))
    weight[0, :GROUP] = 0.25  # a constant group
    codes, scale, zero = quantise_int4(weight)
    assert codes.dtype == torch.int32 and int(codes.min()) >= 0 and int(codes.max()) <= 15
    error = (dequantise(codes, scale, zero) - weight).abs()
    assert torch.all(error <= scale.repeat_interleave(GROUP, 1) / 2 + 1e-6)
    assert torch.all(error[0, :GROUP] == 0)
    x = torch.randn(3, 96).bfloat16()
    expected = F.linear(x.float(), dequantise(codes, scale, zero))
    assert torch.allclose(int4_linear(weight)(x).float(), expected, atol=0.05, rtol=0.02)


def test_an_int4_pass_drafts_close_to_the_dense_one():
    target = make_tiny_target("llama")
    target.model.to(torch.bfloat16)
    drafter = make_drafter(target)
    features = torch.randn(1, 17, 3 * 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    drafter.use_draft_pass(DraftPass(drafter))
    dense = cycles(drafter, features, slots=4)
    drafter.use_draft_pass(DraftPass(drafter, int4_linear))
    int4 = cycles(drafter, features, slots=4)
    for (_, hidden, _), (_, int4_hidden, _) in zip(dense, int4, strict=True):
        cosine = F.cosine_similarity(hidden.float(), int4_hidden.float(), dim=-1)
        assert torch.all(cosine > 0.95)


@pytest.mark.skipif(not int4_dot_available(), reason="no int4_dot build here")
def test_a_w4a8_pass_runs_each_layer_half_in_one_call_as_its_operators_would():
    target = make_tiny_target("llama")
    target.model.to(torch.bfloat16)
    drafter = make_drafter(target)
    features = torch.randn(1, 17, 3 * 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    draft_pass = DraftPass(drafter, w4a8_linear)
    assert all(layer.fused for layer in draft_pass.layers)
    drafter.use_draft_pass(draft_pass)
    fused = cycles(drafter, features, slots=4)
    for layer in draft_pass.layers:
        layer.fused = False
    operators = cycles(drafter, features, slots=4)
    for (logits, hidden, _), (op_logits, op_hidden, _) in zip(fused, operators, strict=True):
        # silu's exp may round a value to the neighbouring bf16; nothing else differs
        assert (hidden != op_hidden).float().mean() < 0.01
        assert torch.allclose(hidden.float(), op_hidden.float(), rtol=2**-6, atol=2**-6)
        assert torch.equal(logits.argmax(-1), op_logits.argmax(-1))


@pytest.mark.skipif(not int4_dot_available(), reason="no int4_dot build here")
def test_a_catch_up_of_skipped_taps_stays_on_the_int8_row_kernel():
    # after plain cycles a pass reads every tap they skipped: up to CATCH_UP_ROWS rows go through
    # the kernel MAX_ROWS at a time, each row as a step's call computes it; a prompt's first pass
    # keeps the layer's dequantised copy
    target = make_tiny_target("llama")
    target.model.to(torch.bfloat16)
    draft_pass = DraftPass(make_drafter(target), w4a8_linear)
    layer = draft_pass.fc
    rows = torch.randn(40, layer.in_features, generator=torch.Generator().manual_seed(2)).bfloat16()
    each = torch.cat([layer.forward(row[None]) for row in rows])
    assert torch.equal(draft_pass._product(layer, rows), each)
    assert not torch.equal(layer.forward(rows), each)  # the dequantised copy rounds otherwise
    prompt = rows.repeat(CATCH_UP_ROWS // 40 + 1, 1)
    assert torch.equal(draft_pass._product(layer, prompt), layer.forward(prompt))


@pytest.fixture
def drafter_dir(tmp_path):
    target = make_tiny_target("llama")
    target.model.to(torch.bfloat16)
    drafter = make_drafter(target, block=5)
    return save_drafter(tmp_path / "drafter", drafter, target.info, dtype=torch.float32)


@pytest.mark.parametrize("method", ["dflash", "pld-dflash"])
def test_greedy_output_with_an_int4_drafted_block_is_plain_decodings(drafter_dir, method):
    target = make_tiny_target("llama")
    target.model.to(torch.bfloat16)
    options = MethodOptions(draft_dtype="int4", draft_block="drafted", num_draft_tokens=3)
    proposer = build_proposer(f"{method}@{drafter_dir}", target, options)
    drafter = getattr(proposer, "proposer", proposer).drafter
    assert drafter.drafted_rows_only and drafter._fast
    for seed in range(2):
        prompt = torch.randint(5, 128, (10,), generator=torch.Generator().manual_seed(seed))
        plain = Engine(target).generate(prompt.tolist(), 24).new_ids
        assert Engine(target, proposer).generate(prompt.tolist(), 24).new_ids == plain


def test_bad_settings_fail_clearly(monkeypatch):
    with pytest.raises(DcocoError, match="unknown draft block 'half'"):
        check_draft_block("half")
    target = make_tiny_target("llama")
    target.model.to(torch.bfloat16)
    config = make_drafter(target).config
    gpu = types.SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16)
    with pytest.raises(DcocoError, match="int4 runs on the CPU"):
        drafter_product("int4", gpu, config)
    assert drafter_product("target", gpu, config) is None
    # widths the int4 kernel does not pack: auto falls back, int4 says why
    monkeypatch.setattr(draft_precision, "native_bf16", lambda: True)
    monkeypatch.setattr(draft_precision, "amx_bf16", lambda: False)
    for module in (draft_precision, int4_dot):  # auto's choice, and the check w4a8 makes
        monkeypatch.setattr(module, "int4_dot_available", lambda: False)
    assert drafter_product("auto", target, config) is int4_linear
    odd = dataclasses.replace(config, intermediate_size=120)
    assert drafter_product("auto", target, odd) is None
    with pytest.raises(DcocoError, match="divisible by 32"):
        drafter_product("int4", target, odd)
    # w4a8 where its kernel built (auto picks it), a clear line where it did not
    with pytest.raises(DcocoError, match="w4a8 needs AVX-512 VNNI or AVX2"):
        drafter_product("w4a8", target, config)
    for module in (draft_precision, int4_dot):
        monkeypatch.setattr(module, "int4_dot_available", lambda: True)
    assert drafter_product("auto", target, config) is w4a8_linear
    assert drafter_product("int4", target, config) is int4_linear
