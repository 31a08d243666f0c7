"""Bench metrics on synthetic sample records (built from real RequestStats, JSON round-tripped)."""

from __future__ import annotations

import json

import pytest

from dcoco.decode.stats import RequestStats
from dcoco.eval import metrics


def make_record(
    cycles: list[tuple[int, int]],  # (slots drafted, drafts accepted) per verify cycle
    method: str = "pld",
    suite: str = "gsm8k",
    id: str = "a",
    seconds: float = 1.0,
    new_ids: list[int] | None = None,
    temperature: float = 0.0,
) -> dict:
    stats = RequestStats(prompt_tokens=10)
    for slots, accepted in cycles:
        stats.record_cycle(slots, accepted)
    stats.new_tokens = 1 + sum(accepted + 1 for _, accepted in cycles)  # prefill gives one
    stats.prefill_s, stats.draft_s, stats.verify_s = 0.1 * seconds, 0.2 * seconds, 0.5 * seconds
    stats.correct_s = 0.1 * seconds
    stats.total_s = seconds
    record = {
        "method": method,
        "temperature": temperature,
        "suite": suite,
        "category": "code" if suite == "humaneval" else "math",
        "id": id,
        "turn": 1,
        "new_ids": new_ids if new_ids is not None else list(range(stats.new_tokens)),
        **stats.summary(),
    }
    return json.loads(json.dumps(record))  # as read back from samples.jsonl: string hist keys


def test_tau_counts_the_bonus_token():
    assert metrics.sample_tau(make_record([(0, 0)] * 5, method="plain")) == 1.0
    assert metrics.sample_tau(make_record([(4, 4), (4, 0)])) == pytest.approx((5 + 1) / 2)
    assert metrics.sample_tau(make_record([])) is None  # stopped on the prefill's token


def test_histogram_pools_cycles():
    records = [make_record([(4, 4), (4, 0)]), make_record([(4, 0), (4, 2)])]
    assert metrics.accept_hist(records) == {1: 2, 3: 1, 5: 1}


def test_pooled_tau_weighs_cycles_mean_tau_weighs_samples():
    short = make_record([(4, 4)], id="short")  # τ = 5 over 1 cycle
    long = make_record([(4, 0)] * 9, id="long")  # τ = 1 over 9 cycles
    assert metrics.mean_tau([short, long]) == pytest.approx(3.0)
    assert metrics.pooled_tau([short, long]) == pytest.approx((5 + 9) / 10)


def test_per_position_pools_counts_not_rates():
    # sample A: slot 1 reached 4x, accepted 1x; sample B: slot 1 reached 1x, accepted 1x.
    a = make_record([(2, 0), (2, 0), (2, 0), (2, 1)])
    b = make_record([(2, 2)])
    rates, reached = metrics.per_position([a, b])
    assert reached == [5, 2]
    assert rates[0] == pytest.approx(2 / 5)  # averaging the rates would give (1/4 + 1) / 2
    assert rates[1] == pytest.approx(1 / 2)  # slot 2 reached by A's last cycle and B's only one


def test_per_position_handles_ragged_slot_counts():
    rates, reached = metrics.per_position([make_record([(1, 1)]), make_record([(3, 1)])])
    assert reached == [2, 1, 0] and rates == [1.0, 0.0, None]  # slot 3: drafted, never reached


def test_cycle_split_shares_sum_to_one():
    split = metrics.cycle_split([make_record([(4, 1)] * 4, seconds=2.0)])
    assert sum(split[part] for part in metrics.CYCLE_PARTS) == pytest.approx(1.0)
    assert split["correct"] == pytest.approx(0.1 / 0.9, rel=1e-3)
    assert split["cycle_ms"] == pytest.approx(1000 * 1.8 / 4, rel=1e-3)


def test_speedup_uses_only_prompts_both_methods_ran():
    plain = [
        make_record([(0, 0)] * 9, method="plain", id="a", seconds=2.0),  # 10 tokens
        make_record([(0, 0)] * 9, method="plain", id="b", seconds=2.0),
    ]
    fast = [
        make_record([(4, 4), (4, 2)], method="pld", id="a", seconds=1.0),  # 9 tokens
        make_record([(4, 4)], method="pld", id="only-pld", seconds=100.0),
    ]
    expected = (2.0 / 10) / (1.0 / 9)
    assert metrics.speedup(fast, plain) == pytest.approx(expected, rel=1e-3)
    assert metrics.speedup(fast[1:], plain) is None


def test_match_rate_compares_token_ids():
    plain = [make_record([], method="plain", id=i, new_ids=[1, 2]) for i in "ab"]
    pld = [
        make_record([], id="a", new_ids=[1, 2]),
        make_record([], id="b", new_ids=[1, 3]),
    ]
    assert metrics.match_rate(pld, plain) == 0.5


def test_summarize_per_temperature_suite_and_category():
    records = [
        make_record([(0, 0)] * 3, method="plain", suite="gsm8k", new_ids=[1]),
        make_record([(0, 0)] * 3, method="plain", suite="humaneval", new_ids=[1]),
        make_record([(4, 3)], suite="gsm8k", new_ids=[1]),
        make_record([(4, 3)], suite="humaneval", new_ids=[9]),
        make_record([(0, 0)], method="plain", temperature=1.0),
        make_record([(4, 0)], temperature=1.0),
    ]
    summary = metrics.summarize(records)
    assert summary["temperatures"] == [0.0, 1.0] and summary["baseline"] == "plain"
    greedy = summary["results"]["0"]["pld"]
    assert set(greedy["suites"]) == {"gsm8k", "humaneval"}
    assert set(greedy["categories"]) == {"math", "code"}
    assert greedy["suites"]["gsm8k"]["match_rate"] == 1.0
    assert greedy["overall"]["match_rate"] == 0.5
    assert greedy["overall"]["tau"] == pytest.approx(4.0)
    assert summary["results"]["0"]["plain"]["overall"]["speedup"] == pytest.approx(1.0)
    assert summary["results"]["1"]["pld"]["overall"]["match_rate"] is None  # sampled


def test_summary_lists_suites_in_canonical_order_then_unknown_ones():
    records = [
        make_record([(0, 0)], method="plain", suite=suite, new_ids=[1])
        for suite in ("mine", "humaneval", "gsm8k", "alpaca")
    ]
    assert metrics.summarize(records)["suites"] == ["gsm8k", "humaneval", "alpaca", "mine"]
