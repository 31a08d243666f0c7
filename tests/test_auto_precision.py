"""`--dtype auto`'s rate model (dcoco.decode.auto_precision): a method's expected tokens per ms
at its best draft length, its draft pass counted, and a plain step where no draft pays."""

from __future__ import annotations

import pytest

from dcoco.decode.auto_precision import describe, method_choice
from dcoco.decode.cost_curve import CostCurve, measure_draft
from dcoco.decode.draft_length import FLAT_PRIOR, expected_tokens
from dcoco.decode.methods import MethodOptions, build_proposer

FLAT = CostCurve("flat", {n: 10.0 for n in range(1, 17)})  # a verify costs one step at any k

pytestmark = pytest.mark.usefixtures("one_thread")


def test_plain_expects_one_token_a_step(tiny_llama_target):
    rate = method_choice("plain", tiny_llama_target, FLAT, MethodOptions())[0]
    assert rate == pytest.approx(0.1)


def test_the_draft_pass_counts_and_a_costly_one_leaves_the_plain_step(tiny_llama_target):
    target, options = tiny_llama_target, MethodOptions()
    slots = build_proposer("pld", target, options).num_draft_tokens
    longest = expected_tokens([FLAT_PRIOR] * slots, slots)  # free verify: draft everything
    assert method_choice("pld", target, FLAT, options)[0] == pytest.approx(longest / 10.0)
    assert method_choice("pld", target, FLAT, options, 5.0)[0] == pytest.approx(longest / 15.0)
    # a draft dearer than what it wins: no draft, as the engine's auto draft length would do
    assert method_choice("pld", target, FLAT, options, 100.0)[0] == pytest.approx(0.1)


def test_a_drafters_pass_is_timed_at_the_targets_precision(tiny_llama_target):
    proposer = build_proposer("pld", tiny_llama_target, MethodOptions())
    draft_ms, correct_ms = measure_draft(tiny_llama_target, proposer, 3)
    assert draft_ms > 0 and correct_ms == 0


def test_the_choice_names_its_draft_length_and_says_why(tiny_llama_target):
    target, options = tiny_llama_target, MethodOptions()
    slots = build_proposer("pld", target, options).num_draft_tokens
    assert method_choice("pld", target, FLAT, options)[1] == slots
    assert method_choice("pld", target, FLAT, options, 100.0) == (pytest.approx(0.1), 0)
    record = {
        "dtype": "gguf",
        "tokens_per_ms": {"gguf": 0.0321, "fp32": 0.0264},
        "best": {
            "gguf": {"method": "dcoco", "k": 2, "draft_ms": 17.4},
            "fp32": {"method": "plain", "k": 0, "draft_ms": 0.0},
        },
    }
    assert describe(record) == (
        "gguf 0.0321 (dcoco: 2 drafts, draft 17.4 ms); fp32 0.0264 (a plain step)"
    )
