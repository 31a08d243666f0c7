"""Load-aware draft heads (dcoco.serving.head_ceiling): up to which batch size the head picks the
drafts, chosen from the probe's cells with and without it, and how `@N` reaches vLLM."""

from __future__ import annotations

import pytest

from dcoco.errors import DcocoError
from dcoco.paths import checkpoints_dir
from dcoco.serving import auto_schedule, schedule_choice
from dcoco.serving.draft_schedule import OPEN_END, parse_pair, split, with_ceiling
from dcoco.serving.head_ceiling import choose_ceiling, head_max_batch, merged_rates
from dcoco.serving.vllm.settings import PluginSettings, use


def settings(text: str) -> tuple[str, int, int]:
    """(sampled schedule, N, M) that `dcoco serve` hands vLLM's processes for `text`."""
    s = PluginSettings().with_schedule(text)
    return s.sampled_schedule, s.head_max_batch, s.sampled_head_max_batch


WITH_HEAD = {1: {0: 30.0, 2: 60.0}, 4: {0: 100.0, 2: 130.0}, 8: {0: 150.0, 2: 150.0}}


def test_ceiling_is_the_last_size_before_the_head_stops_paying():
    without = {1: {2: 55.0}, 4: {2: 131.0}, 8: {2: 170.0}}  # the head loses from 4 on
    assert choose_ceiling(WITH_HEAD, without) == 1
    assert choose_ceiling(WITH_HEAD, {1: {2: 50.0}, 4: {2: 120.0}, 8: {2: 140.0}}) == OPEN_END
    assert choose_ceiling(WITH_HEAD, {1: {2: 61.0}, 4: {2: 99.0}, 8: {2: 140.0}}) == 0
    # a size the head-off probe did not time never ends the head's range
    assert choose_ceiling(WITH_HEAD, {1: {2: 50.0}}) == OPEN_END


def test_beyond_the_ceiling_the_schedule_reads_the_cells_without_the_head():
    without = {1: {2: 55.0}, 4: {2: 131.0}, 8: {2: 170.0}}
    merged = merged_rates(WITH_HEAD, without, ceiling=1)
    assert merged == {1: WITH_HEAD[1], 4: {0: 100.0, 2: 131.0}, 8: {0: 150.0, 2: 170.0}}


def test_schedule_from_a_probe_with_the_head_off_cells():
    step_s = {"0": {"1": 0.03, "4": 0.04, "8": 0.05}, "2": {"1": 0.04, "4": 0.08, "8": 0.14}}
    sampled_steps = {"0": {"1": 0.03}, "1": {"1": 0.035}}
    summary = {
        "step_s": {"0": step_s, "1": sampled_steps},
        "acceptance": {"0": [0.8, 0.6], "1": [0.3]},
        "rates": {},
        # the drafter's own top-1: cheaper steps, a little less accepted
        "head_off": {
            "step_s": {"0": {"2": {"1": 0.036, "4": 0.05, "8": 0.07}}, "1": {"1": {"1": 0.031}}},
            "acceptance": {"0": [0.7, 0.5], "1": [0.25]},
        },
    }
    schedule, rates = schedule_choice.schedule_from(summary)
    # one request: 2.4 / 0.04 = 60 tok/s with the head, 2.2 / 0.036 = 61.1 without, so the head
    # never picks (@0), and without it K = 2 pays at every size (4: 176 against 100 at K = 0);
    # sampled, 1.3 / 0.035 = 37.1 with the head, 1.25 / 0.031 = 40.3 without: @0 as well
    assert schedule == "1-:2/1:1,2-:0@0"  # sampled: timed at one request only
    assert rates["0 without head"]["2"] == {"1": 61.11, "4": 176.0, "8": 251.43}
    assert rates["1 without head"]["1"] == {"1": 40.32}
    summary["head_off"]["acceptance"]["0"] = [0.2, 0.1]  # poor without its head when greedy
    # greedy, with the head: K = 2 up to 4 requests (at 4: 120 tokens/s against K = 0's 100; K = 1
    # pays the same drafter pass, 0.08 s, for 90); none at 8 (K = 0 160, K = 2 137); sampled
    # steps still draft without it (M = 0), at the one size they were timed at
    assert schedule_choice.schedule_from(summary)[0] == "1-4:2,5-:0/1:1,2-:0@65536/0"
    summary["head_off"]["acceptance"]["1"] = [0.1]  # and when sampled: no ceiling at all
    assert schedule_choice.schedule_from(summary)[0] == "1-4:2,5-:0/1:1,2-:0"


def test_ceiling_travels_in_the_schedule_text_to_the_plugins_settings():
    assert split("1:7,2-:0/1-:0@8") == ("1:7,2-:0/1-:0", 8, 8)
    assert split("1:7,2-:0") == ("1:7,2-:0", OPEN_END, OPEN_END)
    assert with_ceiling("1:7,2-:0/1-:0", 8) == "1:7,2-:0/1-:0@8"
    assert with_ceiling("1:7,2-:0/1-:0", OPEN_END) == "1:7,2-:0/1-:0"
    assert parse_pair("1:7,2-:0/1-:0@8", max_k=7) == (
        [(1, 1, 7), (2, OPEN_END, 0)],
        [(1, OPEN_END, 0)],
    )
    assert settings("1:7,2-:0/1-:0@8") == ("1-:0", 8, 8)
    assert settings("1:7,2-:0/1-:0") == ("1-:0", OPEN_END, OPEN_END)
    assert settings("1:7,2-:0@0") == ("", 0, 0)
    # `/M`: the ceiling in steps of sampled requests only
    assert split("1:7,2-:0/1:2,2-:0@8/0") == ("1:7,2-:0/1:2,2-:0", 8, 0)
    assert with_ceiling("1:7,2-:0/1-:0", 8, 0) == "1:7,2-:0/1-:0@8/0"
    assert with_ceiling("1:7,2-:0/1-:0", 8, 8) == "1:7,2-:0/1-:0@8"
    assert settings("1:7,2-:0/1:2,2-:0@8/0") == ("1:2,2-:0", 8, 0)
    assert settings("1:7,2-:0@65536/2") == ("", OPEN_END, 2)
    for bad in ("1:7,2-:0@eight", "1:7,2-:0@8/", "1:7,2-:0@8/x"):
        with pytest.raises(DcocoError, match="after @ comes the head's largest batch size"):
            parse_pair(bad, max_k=7)


def test_plugin_reads_the_ceiling_at_every_step(monkeypatch):
    from dcoco.serving.vllm.settings import SETTINGS_ENV

    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    assert head_max_batch() == OPEN_END
    use(PluginSettings().with_schedule("1-:7@4"))
    assert head_max_batch() == 4
    use(PluginSettings().with_schedule("1-:7@0"))
    assert head_max_batch() == 0
    assert head_max_batch(sampled_step=True) == 0  # M defaults to N
    use(PluginSettings().with_schedule("1-:7@0/2"))
    assert (head_max_batch(), head_max_batch(sampled_step=True)) == (0, 2)
    monkeypatch.setenv(SETTINGS_ENV, "{not json")
    with pytest.raises(DcocoError, match="not dcoco's plugin settings"):
        head_max_batch()


def test_probe_times_the_head_off_only_for_a_drafter_with_a_head():
    speculative = {"method": "dflash", "num_speculative_tokens": 3}
    for checkpoint, expected in (("dflash", False), ("dcoco-joint-12k", True)):
        model = str(checkpoints_dir() / "smollm2-135m-instruct" / checkpoint)
        probe = {"speculative": {**speculative, "model": model}}
        assert auto_schedule._probe_request(probe)["head"] is expected
    ngram = {"speculative": {"method": "ngram", "num_speculative_tokens": 3}}
    assert auto_schedule._probe_request(ngram)["head"] is False


def test_probe_times_every_k_and_the_head_off_in_alternation_batch_by_batch():
    from dcoco.serving.vllm.schedule_probe import cell_order

    variants = [(0, True), (2, True), (2, False)]  # (K, head on)
    order = cell_order([1, 2, 4, 8], variants)
    assert order[:6] == [
        (1, (0, True)), (1, (2, True)), (1, (2, False)),
        (2, (2, False)), (2, (2, True)), (2, (0, True)),
    ]  # fmt: skip
    assert [batch for batch, _ in order] == [1] * 3 + [2] * 3 + [4] * 3 + [8] * 3
    # over every two batch sizes each variant sits at each position once from either end, so a
    # drift over the cells hits them alike
    for variant in variants:
        places = [n % 3 for n, (_, v) in enumerate(order) if v == variant]
        assert sum(places) / len(places) == 1  # the middle of three, on average
    assert cell_order([1, 4], [(0, True)]) == [(1, (0, True)), (4, (0, True))]
    # a second pass runs the first backwards (A B B A): over both, every cell sits as far from
    # the probe's middle on average, so a drift over the whole probe hits every cell alike
    twice = cell_order([1, 2, 4, 8], variants, passes=2)
    assert twice == order + order[::-1]
    middle = (len(twice) - 1) / 2
    for cell in order:
        places = [n for n, c in enumerate(twice) if c == cell]
        assert len(places) == 2 and sum(places) / 2 == middle


def test_a_heads_step_is_its_head_off_twin_plus_the_heads_own_cost():
    from dcoco.serving.head_ceiling import head_steps
    from dcoco.serving.schedule_choice import schedule_from

    acceptance = {"0": [0.6, 0.4], "1": [0.3, 0.1]}
    off_acceptance = {"0": [0.55, 0.35], "1": [0.3, 0.1]}
    zero = {"1": 0.030, "2": 0.034}
    summary = {
        # the head's own cells ran in a slow minute: 20 ms more than their twins
        "step_s": {t: {"0": zero, "2": {"1": 0.060, "2": 0.064}} for t in ("0", "1")},
        "acceptance": acceptance,
        "head_off": {
            "step_s": {t: {"2": {"1": 0.040, "2": 0.044}} for t in ("0", "1")},
            "acceptance": off_acceptance,
            "logits_s": {t: {"2": {"1": 0.0010, "2": 0.0011}} for t in ("0", "1")},
        },
        # a compute_logits call with the head: 1 ms more than without (greedy and sampled alike)
        "logits_s": {t: {"2": {"1": 0.0020, "2": 0.0021}} for t in ("0", "1")},
    }
    steps = head_steps(summary, "0")
    assert steps["2"] == {"1": pytest.approx(0.041), "2": pytest.approx(0.045)}
    assert steps["0"] == zero  # K = 0: no head, as timed
    # greedy: the head's +0.1 tau for 1 ms pays at both sizes; sampled: no gain, it never pays
    text, _ = schedule_from(summary)
    assert text.endswith("@65536/0")
    # without the calls timed (probe version 9 and older) the head's own cells decide: 20 ms
    # slower, it never pays
    older = {**summary, "logits_s": None}
    older["head_off"] = {**summary["head_off"], "logits_s": None}
    assert head_steps(older, "0")["2"] == summary["step_s"]["0"]["2"]
    assert schedule_from(older)[0].endswith("@0")
    # a head cheaper per call than the drafter's own top-1 never reads below its twin
    cheaper = {**summary, "logits_s": {t: {"2": {"1": 0.0005, "2": 0.0005}} for t in ("0", "1")}}
    assert head_steps(cheaper, "0")["2"] == {"1": 0.040, "2": 0.044}
