"""From the schedule probe's measurements to a schedule (dcoco.serving.schedule_choice): the
choice per batch size, the step times interpolated between measured draft lengths, the predicted
tokens/s."""

from __future__ import annotations

import pytest

from dcoco.errors import DcocoError
from dcoco.serving import schedule_choice
from dcoco.serving.draft_schedule import OPEN_END
from dcoco.serving.schedule_choice import choose


def test_choose_takes_the_shortest_near_best_k_and_the_smaller_k_between_sizes():
    rates = {
        1: {0: 35.0, 3: 68.0, 7: 85.0},
        2: {0: 68.0, 3: 71.5, 7: 61.0},  # 3 wins
        4: {0: 126.0, 3: 108.0, 7: 90.0},  # 0 wins
        8: {0: 235.0, 3: 167.0, 7: 131.0},
    }
    assert choose(rates) == [(1, 1, 7), (2, 2, 3), (3, OPEN_END, 0)]
    # within TOLERANCE of the fastest, the shorter draft is taken
    assert choose({1: {0: 50.0, 3: 99.0, 7: 100.0}}) == [(1, OPEN_END, 3)]
    with pytest.raises(DcocoError, match="include 1"):
        choose({2: {0: 1.0}})


def test_between_measured_sizes_the_smaller_k_holds():
    rates = {1: {0: 1.0, 5: 2.0}, 4: {0: 1.0, 2: 2.0}, 16: {0: 2.0, 2: 1.0}}
    assert choose(rates) == [(1, 1, 5), (2, 4, 2), (5, OPEN_END, 0)]


def test_step_times_between_measured_draft_lengths_are_interpolated():
    step_s = {"0": {"1": 0.02, "4": 0.04}, "2": {"1": 0.03, "4": 0.08}, "5": {"1": 0.06}}
    assert schedule_choice.interpolated(step_s) == {
        "0": {"1": 0.02, "4": 0.04},
        # below the first drafting K: the line through K = 2 and 5 extended (0.03 - 0.01),
        # at least K = 0's time; where only K = 2 is measured, K = 2's time
        "1": {"1": 0.02, "4": 0.08},
        "2": {"1": 0.03, "4": 0.08},
        "3": {"1": 0.04},  # a batch size measured at one end only stays out
        "4": {"1": 0.05},
        "5": {"1": 0.06},
    }


def test_a_short_draft_pays_the_drafters_pass_not_a_share_of_it():
    # the probe's cells for `dcoco` at T = 1, one request (2026-12-04, Xeon): K = 0 29.8 ms,
    # K = 2 43.7 ms, K = 4 43.4 ms; served K = 1 ran at K = 2's cost
    step_s = {"0": {"1": 0.0298}, "2": {"1": 0.0437}, "4": {"1": 0.0434}}
    assert schedule_choice.interpolated(step_s)["1"] == {"1": 0.0437}  # not 0.0367
    rates = schedule_choice.predicted_rates(
        schedule_choice.interpolated(step_s), [0.3198, 0.1319, 0.0611, 0.0335]
    )
    assert rates["1"]["1"] < rates["0"]["1"]  # 30.2 against 33.6: one draft no longer pays
    # a drafting K whose line falls below K = 0 is held at K = 0's time
    step_s = {"0": {"1": 0.030}, "2": {"1": 0.031}, "4": {"1": 0.040}}
    assert schedule_choice.interpolated(step_s)["1"] == {"1": 0.030}


def test_predicted_rates_are_batch_times_tau_over_step_time():
    step_s = {"0": {"1": 0.02, "4": 0.05}, "2": {"1": 0.025, "4": 0.08}}
    predicted = schedule_choice.predicted_rates(step_s, [0.8, 0.5, 0.3])
    assert predicted == {"0": {"1": 50.0, "4": 80.0}, "2": {"1": 92.0, "4": 115.0}}


def test_a_k_timed_at_every_batch_size_is_read_off_a_quadratic_fit():
    # `dcoco`'s K = 4 cells of 2026-12-05 (probe version 7): 4 requests read 77.9 ms
    row = {"1": 0.0471, "2": 0.0479, "4": 0.0779, "8": 0.0882, "16": 0.1334, "32": 0.1926}
    fit = schedule_choice.smoothed({"4": row})["4"]
    assert list(fit) == list(row)
    assert 0.060 < fit["4"] < 0.070  # the outlier pulled onto its neighbours' trend
    assert all(abs(fit[b] / row[b] - 1) < 0.10 for b in row if b != "4")
    exact = {str(b): 0.03 + 0.001 * b + 0.0001 * b * b for b in (1, 2, 4, 8, 16, 32)}
    assert schedule_choice.smoothed({"2": exact})["2"] == pytest.approx(exact, rel=1e-4)
    few = {"1": 0.03, "2": 0.05, "4": 0.04}  # the sampled cells: too few sizes to fit
    assert schedule_choice.smoothed({"0": few}) == {"0": few}


def test_sampled_requests_draft_only_up_to_the_largest_batch_they_were_timed_at():
    # greedy and sampled steps alike: K = 2 pays at 1, 2 and 4 requests (tau 1.8 at 1.25x a step)
    steps = {"0": {"1": 0.020, "2": 0.024, "4": 0.032}, "2": {"1": 0.025, "2": 0.030, "4": 0.040}}
    summary = {
        "step_s": {"0": steps, "1": {k: {"1": v["1"], "2": v["2"]} for k, v in steps.items()}},
        "acceptance": {"0": [0.6, 0.2], "1": [0.6, 0.2]},
        "rates": {},
    }
    # greedy, timed up to 4, keeps K = 2 past it; sampled, timed up to 2, drafts nothing past 2
    assert schedule_choice.schedule_from(summary)[0] == "1-:2/1-2:2,3-:0"
