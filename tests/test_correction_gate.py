"""The correction gate (dcoco.decode.correction_gate): the argmax draft's acceptance read off a
corrected cycle's commits, the switch at a draft length where the corrector costs more than it
gains, re-measuring while off, and decoding through it equal to plain."""

from __future__ import annotations

import pytest
import torch

from dcoco.decode import correction_gate
from dcoco.decode.correction_gate import EXPLORE, MIN_CYCLES, CorrectionGate
from dcoco.decode.engine import Engine
from dcoco.decode.head_proposer import HeadProposer


def scored(gate: CorrectionGate, corrected, argmax, committed, correct_s=0.0) -> None:
    """One corrected cycle after 10 tokens, then the commits it led to."""
    gate.drafted(10, corrected, argmax, correct_s, started=0.0)
    gate.observe(torch.tensor(list(range(10)) + committed))


@pytest.mark.parametrize(
    "corrected,argmax,committed,accepted,argmax_accepted",
    [
        ([1, 2, 3], [1, 2, 3], [1, 2, 9], 2, 2),  # the same drafts, rejected alike
        ([1, 2, 3], [1, 5, 3], [1, 2, 9], 2, 1),  # corrected at slot 1, which was accepted
        ([1, 2, 3], [1, 5, 3], [1, 5], 1, 2),  # the argmax's slot 1 was the target's: >= 2
        ([1, 2, 3], [1, 2, 3], [1, 2, 3, 4], 3, 3),  # all accepted, the bonus token after
    ],
)
def test_a_corrected_cycle_tells_what_the_argmax_would_have_had_accepted(
    corrected, argmax, committed, accepted, argmax_accepted
):
    gate = CorrectionGate()
    scored(gate, corrected, argmax, committed)
    tally = gate.tallies[3]
    assert (tally.cycles, tally.corrected, tally.argmax) == (1, accepted, argmax_accepted)


def test_the_corrector_stays_on_while_it_pays_and_goes_off_where_it_does_not(monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(correction_gate.time, "perf_counter", lambda: float(next(clock)))
    gate = CorrectionGate()
    # at 2 slots correction gains a token a cycle for a tenth of it; at 1 slot it gains nothing
    for _ in range(MIN_CYCLES):
        assert gate.should_correct(2) and gate.should_correct(1)
        scored(gate, [1, 2], [1, 5], [1, 2, 7], correct_s=0.1)
        scored(gate, [1], [1], [1, 6], correct_s=0.1)
    assert gate.should_correct(2)
    choices = [gate.should_correct(1) for _ in range(2 * EXPLORE)]
    assert choices.count(True) == 2  # off, but re-measured every EXPLORE-th cycle


def test_sampled_cycles_and_a_new_request_score_nothing():
    gate = CorrectionGate()
    gate.drafted(10, [1, 2], [1, 2], 0.0, started=0.0)
    gate.start()
    gate.observe(torch.arange(14))
    assert 2 not in gate.tallies


def test_decoding_through_the_gate_equals_plain_and_scores_its_cycles(tiny_llama_target):
    from tests.test_head_compile import PROMPT, _engine_corrector

    drafter, corrector = _engine_corrector(tiny_llama_target)
    proposer = HeadProposer(drafter, corrector, num_draft_tokens=3, correction_gate=True)
    plain = Engine(tiny_llama_target).generate(PROMPT, 40).new_ids
    assert Engine(tiny_llama_target, proposer).generate(PROMPT, 40).new_ids == plain
    assert sum(tally.cycles for tally in proposer.gate.tallies.values()) > 5


def test_a_cycle_followed_by_plain_steps_is_not_timed_as_one():
    gate = CorrectionGate()
    scored(gate, [1, 2], [1, 2], [1, 2, 3, 4, 5])  # two plain steps after the bonus token
    assert gate.tallies.get(2) is None or gate.tallies[2].cycles == 0
