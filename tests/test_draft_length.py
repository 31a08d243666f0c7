"""`--num-draft-tokens auto`: the draft length from the cost curve and per-slot acceptance."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_target

from dcoco.contracts import SamplingParams
from dcoco.decode.cost_curve import CostCurve, forward_curve
from dcoco.decode.draft_length import (
    ContextMode,
    DraftLengthPolicy,
    best_draft_length,
    expected_tokens,
)
from dcoco.decode.engine import Engine
from dcoco.decode.proposers import PromptLookupProposer
from dcoco.decode.session import DecodeConfig
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter_io import stored_slot_accuracy

FLAT = CostCurve("flat", {n: 10.0 for n in range(1, 17)})  # verifying costs the same for any k
LINEAR = CostCurve("linear", {n: 10.0 * n for n in range(1, 17)})  # each token costs a step


def test_expected_tokens():
    assert expected_tokens([], 3) == 1.0
    assert expected_tokens([1.0, 1.0, 1.0], 3) == 4.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.5, 0.0, 1.0], 3) == pytest.approx(1.5)  # a miss ends the chain


def test_best_length_follows_the_curve():
    sure = [0.9] * 8
    assert best_draft_length(sure, FLAT, 0.0, 8) == 8  # free verification: draft all
    # each verified token costs a full step, so only a certain draft pays; 1 is the least
    assert best_draft_length(sure, LINEAR, 0.0, 8) == 1
    knee = CostCurve("knee", {n: 10.0 if n <= 4 else 10.0 * n for n in range(1, 17)})
    assert best_draft_length(sure, knee, 0.0, 8) == 3  # 4 tokens verified at the price of one


def test_best_length_follows_acceptance():
    assert best_draft_length([0.9, 0.9, 0.9, 0.0, 0.0], FLAT, 0.0, 5) == 3
    cheap_until_4 = CostCurve("c", {n: 10.0 + n for n in range(1, 17)})
    assert best_draft_length([0.05] * 6, cheap_until_4, 0.0, 6) == 1


def test_no_drafts_where_none_pays():
    # each verified token costs a full step and drafts are rarely right: plain steps win
    assert best_draft_length([0.05] * 6, LINEAR, 0.0, 6, min_k=0) == 0
    assert best_draft_length([0.05] * 6, LINEAR, 0.0, 6) == 1  # min_k = 1: the least draft
    assert best_draft_length([0.9] * 6, FLAT, 0.0, 6, min_k=0) == 6
    # free verification, but a draft pass as dear as a step and drafts right 40% of the time
    assert best_draft_length([0.4] * 6, FLAT, 10.0, 6, min_k=0) == 0
    assert best_draft_length([0.6] * 6, FLAT, 10.0, 6, min_k=0) == 6


def test_policy_stops_drafting_where_drafts_miss_and_re_measures_ever_less_often():
    from dcoco.decode.draft_length import EXPLORE_EVERY, MAX_EXPLORE_EVERY

    slope = CostCurve("s", {n: 10.0 + 2.0 * n for n in range(1, 17)})
    policy = DraftLengthPolicy(slope, max_k=6, prior=(0.9,) * 6)
    assert policy.next_length() >= 1  # the prior: drafts pay
    for _ in range(50):  # every draft misses (1 ms: 8 plain steps of 12 ms pay for a pass)
        policy.observe(proposed=1, accepted=0, draft_s=0.001)
    lengths = [policy.next_length() for _ in range(400)]
    explored = [i for i, k in enumerate(lengths) if k]
    waits = [b - a for a, b in zip([-1, *explored], explored, strict=False)]
    assert waits[:4] == [EXPLORE_EVERY, 2 * EXPLORE_EVERY, 4 * EXPLORE_EVERY, 8 * EXPLORE_EVERY]
    assert set(waits[4:]) == {MAX_EXPLORE_EVERY}  # doubled up to the cap, then held
    before = policy.counts().draft_ms
    policy.observe(proposed=0, accepted=0, draft_s=0.0)  # a plain step: no cost, no acceptance
    assert policy.counts().draft_ms == before and policy.counts().drafted == 50
    assert policy.cycles == 51
    assert "k = 0" in policy.describe()


def test_an_exploration_waits_until_its_pass_is_a_small_share_of_the_wait():
    from dcoco.decode.draft_length import EXPLORE_BUDGET

    slope = CostCurve("s", {n: 10.0 + 2.0 * n for n in range(1, 17)})  # a plain step: 12 ms
    policy = DraftLengthPolicy(slope, max_k=6, prior=(0.9,) * 6)
    for _ in range(50):
        policy.observe(proposed=1, accepted=0, draft_s=0.120)  # a pass costs 10 plain steps
    lengths = [policy.next_length() for _ in range(1000)]
    first = next(i for i, k in enumerate(lengths) if k)
    assert first + 1 == 10 / EXPLORE_BUDGET  # 500 plain steps, not EXPLORE_EVERY


def test_a_mode_that_drafts_again_explores_at_the_first_interval_after():
    from dcoco.decode.draft_length import EXPLORE_EVERY

    slope = CostCurve("s", {n: 10.0 + 2.0 * n for n in range(1, 17)})
    policy = DraftLengthPolicy(slope, max_k=6, prior=(0.9,) * 6)
    for _ in range(50):
        policy.observe(proposed=1, accepted=0, draft_s=0.001)
    for _ in range(3 * EXPLORE_EVERY):  # two explorations: the wait is now 4 x EXPLORE_EVERY
        policy.next_length()
    assert policy.counts().explore_every == 4 * EXPLORE_EVERY
    for _ in range(200):  # the text turns repetitive: drafts land again
        policy.observe(proposed=6, accepted=6, draft_s=0.001)
    assert policy.next_length() >= 1
    assert policy.counts().explore_every == EXPLORE_EVERY
    for _ in range(5000):  # ... and stop landing: the back-off starts over
        policy.observe(proposed=1, accepted=0, draft_s=0.001)
    lengths = [policy.next_length() for _ in range(EXPLORE_EVERY)]
    assert lengths == [0] * (EXPLORE_EVERY - 1) + [lengths[-1]] and lengths[-1] >= 1


def test_policy_learns_from_verified_cycles():
    policy = DraftLengthPolicy(FLAT, max_k=6, prior=(0.5,) * 6)
    slope = CostCurve("s", {n: 10.0 + 2.0 * n for n in range(1, 17)})
    policy.curve = slope
    for _ in range(200):  # every cycle: slots 1-2 accepted, slot 3 missed
        policy.observe(proposed=6, accepted=2, draft_s=0.001)
    rates = policy.acceptance()
    assert rates[0] > 0.95 and rates[1] > 0.95 and rates[2] < 0.05
    assert rates[3] == pytest.approx(0.5)  # never reached: still the prior
    assert policy.choose() == 2
    assert policy.counts().draft_ms == pytest.approx(1.0)


def test_policy_keeps_each_context_mode_apart():
    slope = CostCurve("s", {n: 10.0 + 2.0 * n for n in range(1, 17)})
    policy = DraftLengthPolicy(slope, max_k=6, prior=(0.5,) * 6)
    for _ in range(200):
        policy.observe(proposed=6, accepted=6, draft_s=0.0, mode=3)  # a loop: every draft lands
        policy.observe(proposed=6, accepted=0, draft_s=0.030, mode=0)  # nothing repeats: misses
    assert policy.choose(3) == 6 and policy.choose(0) == 0  # misses at 30 ms: plain steps
    assert policy.acceptance(3)[5] > 0.95 and policy.acceptance(0)[0] < 0.05
    assert policy.counts(3).draft_ms == 0.0 and policy.counts(0).draft_ms == pytest.approx(30.0)
    assert policy.acceptance(2) == pytest.approx([0.5] * 6)  # a mode never seen: the prior
    assert policy.cycles == 400
    assert "3-gram match: k = 6" in policy.describe()


def test_policy_keeps_sampled_and_greedy_requests_apart():
    """A sampled draft is accepted far less often than a greedy one: each setting learns its own
    rates, so an engine serving both does not over-draft one and under-draft the other."""
    slope = CostCurve("s", {n: 10.0 + 2.0 * n for n in range(1, 17)})
    policy = DraftLengthPolicy(slope, max_k=6, prior=(0.5,) * 6)
    sampled = ContextMode(0, SamplingParams(temperature=1.0))
    for _ in range(200):
        policy.observe(proposed=6, accepted=6, draft_s=0.001, mode=ContextMode(0))
        policy.observe(proposed=6, accepted=0, draft_s=0.001, mode=sampled)
    assert policy.choose(ContextMode(0)) == 6 and policy.choose(sampled) == 0
    assert policy.choose(0) == 6  # an int is a greedy request's match length
    assert "T=1, no match: k = 0" in policy.describe()


def test_the_engine_keys_its_rates_by_the_requests_sampling(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    torch.set_num_threads(1)
    target = make_tiny_target("llama")
    policy = DraftLengthPolicy(LINEAR, max_k=4)
    engine = Engine(target, PromptLookupProposer(4), policy)
    prompt = torch.randint(5, 128, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    greedy = engine.generate(prompt, 20)
    hot = SamplingParams(temperature=1.0)
    sampled = engine.generate(prompt, 20, hot, seed=1)
    by_setting = {}
    for mode, counts in policy.modes.items():
        by_setting[mode.sampling] = by_setting.get(mode.sampling, 0) + counts.cycles
    assert by_setting == {None: greedy.stats.cycles, hot: sampled.stats.cycles}


def test_auto_in_the_engine_keeps_output_and_stays_in_range(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    torch.set_num_threads(1)
    target = make_tiny_target("llama")
    curve = forward_curve(target)
    assert sorted(curve.forward_ms) == list(range(1, 17))
    policy = DraftLengthPolicy(curve, max_k=6)
    prompt = torch.randint(5, 128, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    plain = Engine(target).generate(prompt, 40)
    auto = Engine(target, PromptLookupProposer(6), policy).generate(prompt, 40)
    assert auto.new_ids == plain.new_ids
    assert len(auto.stats.proposed_per_slot) <= 6
    assert policy.cycles == auto.stats.cycles


def test_auto_with_no_drafts_keeps_output_and_feeds_the_drafter_every_tap(tmp_path, monkeypatch):
    """A DFlash drafter that auto mostly skips: the taps of the plain steps reach it when it
    drafts again (after EXPLORE_EVERY cycles, then ever fewer), and the output stays plain
    decoding's."""
    from dcoco.decode.dflash_proposer import DFlashProposer
    from dcoco.models.drafter.drafter import BlockDrafter
    from dcoco.models.drafter.drafter_config import DrafterConfig

    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    target = make_tiny_target("llama")
    config = DrafterConfig.for_target(target, num_layers=1, block_size=5, mask_token_id=3,
                                      target_layer_ids=(0, 1, 3))  # fmt: skip
    proposer = DFlashProposer(BlockDrafter(config, target.embed_tokens, target.lm_head))
    seen = []
    draft = proposer.drafter.draft

    def counted(anchor, new_features, cache, **kwargs):
        seen.append(new_features.shape[1])
        return draft(anchor, new_features, cache, **kwargs)

    monkeypatch.setattr(proposer.drafter, "draft", counted)
    policy = DraftLengthPolicy(LINEAR, max_k=4, prior=(0.01,) * 4)  # drafting never pays
    prompt = torch.randint(5, 128, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    plain = Engine(target).generate(prompt, 160)
    auto = Engine(target, proposer, policy).generate(prompt, 160)
    assert auto.new_ids == plain.new_ids
    assert len(seen) >= 3 and sum(s > 1 for s in seen) >= 2  # several plain steps' taps at once
    # every token before the last cycle's anchor reached the drafter, the prompt's included
    assert sum(seen) <= len(prompt) + len(plain.new_ids)
    assert auto.stats.cycles > len(seen)


def test_cost_curve_is_cached_and_a_corrupt_one_remeasured(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    target = make_tiny_target("llama")
    first = forward_curve(target)
    (path,) = (tmp_path / "profiles").iterdir()
    record = json.loads(path.read_text())
    record["forward_ms"]["1"] = 123.0  # a cached curve is read, not measured again
    path.write_text(json.dumps(record))
    assert forward_curve(target).forward_ms[1] == 123.0
    path.write_text("{not json")
    again = forward_curve(target)
    assert "unreadable" in capsys.readouterr().err
    assert sorted(again.forward_ms) == sorted(first.forward_ms)
    assert again.ms(32) == pytest.approx(again.forward_ms[16] * 2)  # linear past the end


def test_num_draft_tokens_flag():
    assert DecodeConfig().fixed_draft_tokens() is None  # auto is the default
    assert DecodeConfig(num_draft_tokens="3").fixed_draft_tokens() == 3
    for bad in ("0", "-1", "many"):
        with pytest.raises(DcocoError, match="num-draft-tokens must be 'auto'"):
            DecodeConfig(num_draft_tokens=bad).fixed_draft_tokens()


def test_stored_slot_accuracy(tmp_path):
    assert stored_slot_accuracy(tmp_path) == ()
    lines = [
        {"event": "eval", "slot_acc": [0.1, 0.05]},
        {"event": "train", "loss": 1.0},
        {"event": "eval", "slot_acc": [0.4, 0.3, 0.2]},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + '\n{"event": "ev'  # a torn last line
    (tmp_path / "train_log.jsonl").write_text(text)
    assert stored_slot_accuracy(tmp_path) == (0.4, 0.3, 0.2)


def test_profile_prints_curves_and_method_costs(tmp_path, monkeypatch, capsys):
    """`dcoco profile --json` on a tiny target and an untrained drafter: one curve per precision
    mapping "1".."N" to ms, the drafter's cost per slot count, and the k auto starts with."""
    from dcoco.decode import auto_precision
    from dcoco.eval import profile
    from dcoco.models.drafter.drafter import BlockDrafter
    from dcoco.models.drafter.drafter_config import DrafterConfig
    from dcoco.models.drafter.drafter_io import save_drafter

    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    target = make_tiny_target("llama")
    config = DrafterConfig.for_target(target, num_layers=1, block_size=5, mask_token_id=3,
                                      target_layer_ids=(0, 1, 3))  # fmt: skip
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    save_drafter(tmp_path / "drafter", drafter, target.info, dtype=torch.float32)
    monkeypatch.setattr(profile, "load_target", lambda *args, **kwargs: target)
    monkeypatch.setattr(auto_precision, "load_target", lambda *args, **kwargs: target)
    run_config = profile.ProfileConfig(
        dtypes=("bf16",), methods=(f"dflash@{tmp_path / 'drafter'}",), max_tokens=8, json=True
    )
    assert profile.run(run_config) == 0
    report = json.loads(capsys.readouterr().out)
    (curve,) = report["forward_ms"].values()
    assert list(curve) == [str(n) for n in range(1, 17)]  # a curve covers at least 16 tokens
    costs = report["default"]["methods"][f"dflash@{tmp_path / 'drafter'}"]
    assert list(costs["draft_ms"]) == ["1", "2", "3", "4"]
    assert all(ms > 0 for ms in costs["draft_ms"].values())
    assert 0 <= costs["auto_k"] <= 4
    why = report["auto_why"]  # what auto's rate came from, per precision
    assert all(dtype in why for dtype in ("bf16", "gguf", "fp32"))
    # the drafter, or no draft paying: a tiny target's step is so cheap that either can win
    assert f"dflash@{tmp_path / 'drafter'}" in why or "(a plain step)" in why
    for costs in report["draft_ms_by_dtype"].values():  # the draft cost at every precision
        assert costs[f"dflash@{tmp_path / 'drafter'}"] > 0


def test_interleaved_timing_runs_the_calls_in_turn():
    from dcoco.decode.cost_curve import interleaved_ms

    order: list[str] = []
    medians = interleaved_ms([lambda: order.append("a"), lambda: order.append("b")], 3, warmup=1)
    assert order == ["a", "b"] * 4  # one warm-up round, then three timed ones
    assert len(medians) == 2 and all(ms >= 0 for ms in medians)
