"""The `auto` schedule chosen again from the served traffic (dcoco.serving.served_acceptance,
dcoco.serving.live_schedule): the per-position counts, the blend with the probe's calibration,
the choice it moves, and what reaches vLLM's processes. No vLLM here (tests/test_vllm_schedule.py
runs it in an engine)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dcoco.serving import live_schedule, served_acceptance
from dcoco.serving.draft_schedule import OPEN_END
from dcoco.serving.served_acceptance import PRIOR_ROUNDS, PositionCounts, blended, with_traffic
from dcoco.serving.vllm import sampled_drafts as vllm_sampled_drafts
from dcoco.serving.vllm.settings import SETTINGS_ENV, PluginSettings, current

# K = 0 and K = 2 timed at 1 and 2 requests: at the probe's acceptance drafting pays at one
# request only (2 x 1.8 / 0.060 = 60 tokens/s < 2 / 0.032 = 62.5 at two)
RECORD = {
    "schedule": "1:2,2-:0/1-:0",
    "step_s": {
        "0": {"0": {"1": 0.030, "2": 0.032}, "2": {"1": 0.040, "2": 0.060}},
        "1": {"0": {"1": 0.030, "2": 0.032}, "2": {"1": 0.040, "2": 0.060}},
    },
    "acceptance": {"0": [0.5, 0.3], "1": [0.1, 0.05]},
}


def test_counts_follow_each_position_only_while_the_earlier_ones_were_accepted():
    counts = PositionCounts()
    counts.observe(drafts=3, accepted=1)  # positions 0, 1 reached; 0 accepted
    counts.observe(drafts=2, accepted=2)
    counts.observe(drafts=3, accepted=0)  # position 0 reached only
    assert counts.reached == [3, 2, 0] and counts.accepted == [2, 1, 0]
    assert counts.blocks == 3


def test_counts_are_halved_once_the_window_is_full(monkeypatch):
    monkeypatch.setattr(served_acceptance, "WINDOW_ROUNDS", 4)
    counts = PositionCounts()
    for _ in range(4):
        counts.observe(drafts=1, accepted=1)
    assert counts.reached == [2.0] and counts.accepted == [2.0]


def test_without_traffic_the_probes_rates_stand():
    assert blended([0.5, 0.3, 0.1], None) == [0.5, 0.3, 0.1]
    assert blended([0.5, 0.3, 0.1], PositionCounts()) == [0.5, 0.3, 0.1]


def test_traffic_moves_the_rates_and_scales_the_positions_it_never_reached():
    counts = PositionCounts()
    for _ in range(3 * PRIOR_ROUNDS):
        counts.observe(drafts=1, accepted=1)  # position 1 always accepted; 2 and 3 never drafted
    first = (3 * PRIOR_ROUNDS + PRIOR_ROUNDS * 0.5) / (4 * PRIOR_ROUNDS)
    rates = blended([0.5, 0.3, 0.1], counts)
    # the probe's conditionals 0.6 and 1/3 carried on from the traffic's first rate
    assert rates == [round(first, 4), round(first * 0.6, 4), round(first * 0.6 / 3, 4)]


def test_head_and_no_head_blocks_blend_into_their_own_lists():
    record = {**RECORD, "head_off": {"acceptance": {"0": [0.2], "1": [0.1]}}}
    on, off = PositionCounts(), PositionCounts()
    for _ in range(PRIOR_ROUNDS):
        on.observe(1, 1)
        off.observe(1, 0)
    out = with_traffic(record, {("0", True): on, ("0", False): off})
    assert out["acceptance"]["0"][0] == pytest.approx((PRIOR_ROUNDS + PRIOR_ROUNDS * 0.5) / 400)
    assert out["head_off"]["acceptance"]["0"] == [0.1]  # (0 + 200 x 0.2) / 400
    assert out["acceptance"]["1"] == RECORD["acceptance"]["1"]  # no sampled traffic
    assert record["acceptance"]["0"] == [0.5, 0.3]  # the record itself is left alone


def test_a_side_the_traffic_never_ran_moves_like_the_side_it_ran():
    from dcoco.serving.schedule_choice import schedule_from

    # a head method whose probe kept the head off (K = 2: the head's step 2 ms dearer): its
    # traffic accepts half what the probe's prompts did, on the only side it runs (head off)
    record = {
        **RECORD,
        "step_s": {t: {"0": {"1": 0.030}, "2": {"1": 0.042}} for t in ("0", "1")},
        "acceptance": {"0": [0.6, 0.4], "1": [0.3, 0.1]},
        "head_off": {
            "step_s": {t: {"2": {"1": 0.040}} for t in ("0", "1")},
            "acceptance": {"0": [0.56, 0.36], "1": [0.3, 0.1]},
        },
    }
    off = PositionCounts()
    for n in range(1000):
        off.observe(2, [0, 0, 1, 2][n % 4])  # position 1: half the blocks; 2: half of those
    out = with_traffic(record, {("0", False): off})
    moved = out["head_off"]["acceptance"]["0"]
    assert moved == blended([0.56, 0.36], off) and moved[0] < 0.56
    # the head's rates, unseen, move by the same ratio per position
    assert out["acceptance"]["0"] == pytest.approx(
        [0.6 * moved[0] / 0.56, 0.4 * moved[1] / 0.36], abs=1e-4
    )
    # so the choice between the two stays the probe's, off; left at the probe's rates, the head
    # would have been switched on for greedy steps by the drafter's lower served rates alone
    assert schedule_from(record)[0] == schedule_from(out)[0] == "1-:2/1:2,2-:0@0"
    unmoved = {**out, "acceptance": record["acceptance"]}
    assert schedule_from(unmoved)[0] == "1-:2/1:2,2-:0@65536/0"
    # seen on both sides, or on neither: each side its own blend, as before
    assert with_traffic(record, {})["acceptance"] == record["acceptance"]


def test_traffic_that_accepts_more_than_the_probe_moves_the_schedule(monkeypatch):
    live = live_schedule.LiveSchedule(RECORD)
    assert live.choose() is None  # the probe's own rates: the schedule in force
    for _ in range(4 * PRIOR_ROUNDS):
        live.observe(sampled=False, head_picked=True, drafts=2, accepted=2)
    assert live.since_choice == 4 * PRIOR_ROUNDS and not live.due()  # chosen just now
    monkeypatch.setattr(live_schedule, "RECHOOSE_S", 0.0)
    assert live.due()
    assert live.choose() == "1-:2/1-:0" and live.since_choice == 0
    assert live.choose() is None  # unchanged since


def test_a_method_without_a_head_counts_every_block_as_its_drafters():
    live = live_schedule.LiveSchedule(RECORD)
    live.observe(sampled=True, head_picked=False, drafts=2, accepted=1)
    assert set(live.counts) == {("1", True)}
    headed = live_schedule.LiveSchedule({**RECORD, "head_off": {"acceptance": {}}})
    headed.observe(sampled=False, head_picked=False, drafts=2, accepted=1)
    assert set(headed.counts) == {("0", False)}


def test_an_unreadable_record_leaves_the_schedule_fixed(tmp_path, capsys):
    path = tmp_path / "record.json"
    path.write_text("{not json")
    assert live_schedule.load(str(path)) is None
    assert "live draft schedule off" in capsys.readouterr().err
    path.write_text(json.dumps(RECORD))
    assert live_schedule.load(str(path)).text == RECORD["schedule"]


def test_the_worker_takes_the_new_schedule_ceilings_and_context_limit(monkeypatch):
    started = PluginSettings(context_margin=3, live_record="probe.json").with_schedule("1-:7@8")
    monkeypatch.setenv(SETTINGS_ENV, started.environment()[SETTINGS_ENV])  # restored after
    config = SimpleNamespace(num_speculative_tokens_per_batch_size=[[1, 1, 2]])
    runner = SimpleNamespace(speculative_config=config, dcoco_context_limit=(2, 0))
    worker = SimpleNamespace(worker=SimpleNamespace(model_runner=runner))  # vLLM's wrapper
    live_schedule.apply_in_worker(worker, "1-4:3,5-:0/1:2,2-:0@1/0")
    assert config.num_speculative_tokens_per_batch_size == [[1, 4, 3], [5, 1 << 16, 0]]
    assert "dcoco_context_limit" not in vars(runner)
    assert vllm_sampled_drafts.sampled_drafts(1) == 2
    now = current()
    assert (now.head_max_batch, now.sampled_head_max_batch) == (1, 0)
    assert (now.context_margin, now.live_record) == (3, "probe.json")  # the rest kept
    live_schedule.apply_in_worker(worker, "1-:2/1-:0")  # no ceiling: the head everywhere
    assert (current().head_max_batch, current().sampled_head_max_batch) == (OPEN_END, OPEN_END)
