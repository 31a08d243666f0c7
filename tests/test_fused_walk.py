"""The corrector's walk as one C++ call (dcoco.models.heads.fused_walk) picks what the batched fp32
walk picks, for every corrector option, walking rule and candidate count, over a draft vocabulary's
columns too; the engine's proposer uses it on a CPU."""

from __future__ import annotations

import pytest
import torch

from dcoco.models.cpu import cpu_kernels
from dcoco.models.heads.fused_walk import FusedWalk, fused_walk_for
from dcoco.models.heads.head_compile import HeadSelect
from tests.test_corrector_options import VOCAB
from tests.test_grid_parts import CASES, trained_looking

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(cpu_kernels.kernels() is None, reason="the fused CPU kernels do not build"),
]


def block(batch: int, slots: int, columns: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, slots, 12, generator=generator)
    logits = 3 * torch.randn(batch, slots, columns, generator=generator)
    anchors = torch.randint(0, VOCAB, (batch,), generator=generator)
    return hidden, logits, anchors


@pytest.mark.parametrize("selection", ["greedy", "keep1", "greedy/2"])
@pytest.mark.parametrize("flags,counts", CASES)
def test_the_fused_walk_picks_what_the_batched_walk_picks(flags, counts, selection):
    corrector = trained_looking(flags, counts, torch.float32)
    walk = FusedWalk(corrector, selection, None)
    for slots in (1, 2, 5):
        hidden, logits, anchors = block(24, slots, VOCAB, seed=slots)
        with torch.no_grad():
            expected = corrector.select(hidden, logits, anchors, selection)
        assert torch.equal(walk(hidden, logits, anchors), expected)


def test_over_a_draft_vocabulary_it_maps_columns_to_token_ids():
    corrector = trained_looking(dict(features="normalised", successor_query=True, anchor=True),
                                True, torch.float32)  # fmt: skip
    columns = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:24]
    hidden, logits, anchors = block(16, 4, 24, seed=9)
    with torch.no_grad():
        expected = corrector.select(hidden, logits, anchors, "greedy", column_ids=columns)
    picked = FusedWalk(corrector, "greedy", columns)(hidden, logits, anchors)
    assert torch.equal(picked, expected)
    assert set(picked.flatten().tolist()) <= set(columns.tolist())


def test_a_bf16_corrector_walks_in_fp32_over_bf16_inputs():
    flags = dict(features="normalised", successor_query=True, anchor=True)
    corrector = trained_looking(flags, True, torch.float32)
    hidden, logits, anchors = block(16, 5, VOCAB, seed=4)
    with torch.no_grad():
        expected = corrector.select(hidden, logits, anchors, "greedy")
    walk = FusedWalk(corrector.to(torch.bfloat16), "greedy", None)
    picked = walk(hidden.bfloat16(), logits, anchors)
    # the bf16 weights differ from the fp32 ones by rounding: most picks stay
    assert (picked == expected).float().mean() > 0.8


def test_only_a_walking_rule_over_a_cpu_corrector_is_fused():
    corrector = trained_looking(dict(features="logit", successor_query=False, anchor=False),
                                False, torch.float32)  # fmt: skip
    assert fused_walk_for(corrector, "greedy/2", None) is not None
    assert fused_walk_for(corrector, None, None) is not None  # the default rule walks
    assert fused_walk_for(corrector, "global", None) is None
    assert fused_walk_for(torch.nn.Linear(2, 2), None, None) is None


def test_head_select_with_fused_calls_the_walk_and_compiles_nothing(monkeypatch):
    corrector = trained_looking(dict(features="normalised", successor_query=True, anchor=True),
                                True, torch.float32)  # fmt: skip
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled"))
    select = HeadSelect(corrector, "greedy", None, max_slots=5, compile=True, fused=True)
    hidden, logits, anchors = block(1, 5, VOCAB, seed=2)
    with torch.no_grad():
        expected = corrector.select(hidden, logits, anchors, "greedy")
    assert torch.equal(select(hidden, logits, anchors), expected)
    assert select.fused and select.setup_s == 0.0


def test_weights_that_bf16_holds_are_read_as_bf16_for_the_same_picks():
    """A corrector loaded from a checkpoint (stored in bf16) holds bf16 values in fp32: its
    products' matrices are kept in bf16, and the picks stay the fp32 walk's."""
    flags = dict(features="normalised", successor_query=True, anchor=True)
    corrector = trained_looking(flags, True, torch.float32)
    with torch.no_grad():
        for parameter in corrector.parameters():
            parameter.copy_(parameter.bfloat16().float())
    walk = FusedWalk(corrector, "greedy", None)
    assert walk.weights["pair_w"].dtype == walk.weights["delta_to"].dtype == torch.bfloat16
    assert walk.weights["delta_b"].dtype == torch.float32  # vectors stay fp32
    hidden, logits, anchors = block(24, 5, VOCAB, seed=8)
    with torch.no_grad():
        expected = corrector.select(hidden, logits, anchors, "greedy")
    assert torch.equal(walk(hidden, logits, anchors), expected)
