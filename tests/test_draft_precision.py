"""The drafter's precision (dcoco.decode.draft_precision): `auto` runs it on int4 groups over int8
rows (w4a8) where that kernel builds, else in fp32 beside a bf16 target on a CPU that emulates
bf16, with an LM head copy of its own; output stays plain's."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_target

import dcoco.decode.draft_precision as draft_precision
from dcoco.decode.engine import Engine
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import load_drafter, save_drafter
from dcoco.models.target.precision import quantise_int8_weights

pytestmark = pytest.mark.usefixtures("one_thread")


def bf16_target():
    target = make_tiny_target("llama")
    target.model.to(torch.bfloat16)
    return target


def emulating(monkeypatch, emulated: bool, int8_rows: bool = False) -> None:
    """A CPU that emulates bf16 or not, with or without the w4a8 kernel built."""
    monkeypatch.setattr(draft_precision, "native_bf16", lambda: not emulated)
    monkeypatch.setattr(draft_precision, "int4_dot_available", lambda: int8_rows)


def test_auto_is_w4a8_on_an_emulating_cpu_where_the_kernel_builds(monkeypatch):
    target = bf16_target()
    emulating(monkeypatch, True, int8_rows=True)
    assert draft_precision.draft_setting("auto", target) == "w4a8"
    assert draft_precision.draft_dtype("auto", target) == torch.bfloat16  # the products' rows
    emulating(monkeypatch, False, int8_rows=True)
    assert draft_precision.draft_setting("auto", target) == "w4a8"
    monkeypatch.setattr(draft_precision, "amx_bf16", lambda: True)
    assert draft_precision.draft_setting("auto", target) == "target"  # tiles multiply bf16


def test_auto_is_fp32_only_beside_half_precision_on_an_emulating_cpu(monkeypatch):
    target = bf16_target()
    emulating(monkeypatch, True)
    assert draft_precision.draft_dtype("auto", target) == torch.float32
    assert draft_precision.draft_dtype("target", target) == torch.bfloat16
    emulating(monkeypatch, False)
    assert draft_precision.draft_dtype("auto", target) == torch.bfloat16
    assert draft_precision.draft_dtype("fp32", target) == torch.float32
    full = make_tiny_target("llama")
    assert draft_precision.draft_dtype("auto", full) == torch.float32  # fp32 stays fp32


def test_a_head_without_plain_weights_keeps_the_targets_dtype(monkeypatch):
    target = bf16_target()
    quantise_int8_weights(target.model)
    target.lm_head = target.model.get_output_embeddings()  # the int8 head
    emulating(monkeypatch, True)
    assert draft_precision.draft_dtype("auto", target) == torch.bfloat16
    with pytest.raises(DcocoError, match="draft-dtype target"):
        draft_precision.draft_dtype("fp32", target)
    with pytest.raises(DcocoError, match="unknown draft dtype"):
        draft_precision.draft_dtype("fp8", target)


@pytest.fixture
def drafter_dir(tmp_path):
    target = bf16_target()
    config = DrafterConfig.for_target(
        target, block_size=5, mask_token_id=3, target_layer_ids=(0, 1, 3)
    )
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head).eval()
    return save_drafter(tmp_path / "drafter", drafter, target.info, dtype=torch.float32)


def test_an_fp32_drafter_has_its_own_head_and_drafts_what_fp32_math_drafts(drafter_dir):
    target = bf16_target()
    options = MethodOptions(draft_dtype="fp32")
    proposer = build_proposer(f"dflash@{drafter_dir}", target, options)
    drafter = proposer.drafter
    assert drafter.dtype == torch.float32
    head = drafter._shared[1]
    assert head is not target.lm_head and target.lm_head.weight.dtype == torch.bfloat16
    # the same drafter over an fp32 copy of the target's (bf16-valued) weights
    reference = make_tiny_target("llama")
    reference.model.load_state_dict(target.model.state_dict())
    expected = load_drafter(drafter_dir, reference, torch.float32)
    ids = torch.arange(4, 24)[None]
    features = target.forward(ids, feature_layers=drafter.config.target_layer_ids).features
    ours, _ = drafter.draft(ids[:, -1], features[:, :-1], drafter.new_cache())
    theirs, _ = expected.draft(ids[:, -1], features[:, :-1].float(), expected.new_cache())
    assert torch.allclose(ours, theirs, atol=1e-4)


@pytest.mark.parametrize("method", ["dflash", "pld-dflash"])
def test_greedy_output_with_an_fp32_drafter_is_plain_decodings(drafter_dir, method):
    target = bf16_target()
    options = MethodOptions(draft_dtype="fp32")
    proposer = build_proposer(f"{method}@{drafter_dir}", target, options)
    for seed in range(2):
        prompt = torch.randint(5, 128, (10,), generator=torch.Generator().manual_seed(seed))
        plain = Engine(target).generate(prompt.tolist(), 24).new_ids
        assert Engine(target, proposer).generate(prompt.tolist(), 24).new_ids == plain


def test_an_unknown_draft_dtype_fails_before_any_load():
    from dcoco.decode.session import DecodeConfig

    with pytest.raises(DcocoError, match="unknown draft dtype 'fp8'"):
        DecodeConfig(draft_dtype="fp8").method_options()
