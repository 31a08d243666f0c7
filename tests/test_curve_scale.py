"""`--num-draft-tokens auto` on what the engine times: the verify forwards rescale a stale cached
curve (DraftLengthPolicy.curve_scale), so the draft length follows what a step costs now; a
proposal's one-off set-up is no draft cost."""

from __future__ import annotations

import time

import torch
from conftest import make_tiny_target

from dcoco.decode.cost_curve import CostCurve
from dcoco.decode.draft_length import VERIFY_MIN, VERIFY_WINDOW, DraftLengthPolicy
from dcoco.decode.engine import Engine
from dcoco.decode.proposers import PromptLookupProposer

FLAT = CostCurve("flat", {n: 10.0 for n in range(1, 17)})  # verifying costs the same for any k
SLOPE = CostCurve("slope", {n: 10.0 + 2.0 * n for n in range(1, 17)})  # ms of n tokens


def _policy() -> DraftLengthPolicy:
    return DraftLengthPolicy(SLOPE, max_k=6, prior=(0.7,) * 6, draft_ms=6.0)


def test_a_machine_faster_than_its_cached_curve_drafts_less():
    """A draft pass of 6 ms against steps of 12 ms pays at k = 4; once verifies are timed at a
    quarter of the curve (3 ms steps), the same pass costs twice a step and plain steps win."""
    policy = _policy()
    assert policy.curve_scale == 1.0 and policy.choose() == 4
    for _ in range(VERIFY_MIN - 1):
        policy.observe(4, 2, 0.006, verify_s=0.25 * SLOPE.ms(5) / 1000)
    assert policy.curve_scale == 1.0  # too few timings to move it
    policy.observe(4, 2, 0.006, verify_s=0.25 * SLOPE.ms(5) / 1000)
    assert abs(policy.curve_scale - 0.25) < 1e-9
    assert policy.choose() == 0
    assert "verify 0.25x the cached curve" in policy.describe()


def test_the_scale_is_a_median_over_a_window():
    policy = _policy()
    policy.observe(0, 0, 0.0, verify_s=50 * SLOPE.ms(1) / 1000)  # a slow first call
    for _ in range(VERIFY_MIN):
        policy.observe(0, 0, 0.0, verify_s=2 * SLOPE.ms(1) / 1000)  # plain steps are timed too
    assert abs(policy.curve_scale - 2.0) < 1e-9
    for _ in range(VERIFY_WINDOW):
        policy.observe(2, 1, 0.006, verify_s=0.5 * SLOPE.ms(3) / 1000)
    assert abs(policy.curve_scale - 0.5) < 1e-9  # the older timings left the window
    policy.observe(2, 1, 0.006)  # untimed: nothing to learn about the curve
    assert len(policy.verify_ratios) == VERIFY_WINDOW


def test_the_engine_times_every_verify_against_the_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    torch.set_num_threads(1)
    target = make_tiny_target("llama")
    stale = CostCurve("stale", {n: 1e5 for n in range(1, 17)})  # 100 s a forward: far too slow
    policy = DraftLengthPolicy(stale, max_k=4)
    prompt = torch.randint(5, 128, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    result = Engine(target, PromptLookupProposer(4), policy).generate(prompt, 12)
    assert len(policy.verify_ratios) == min(result.stats.cycles, VERIFY_WINDOW)
    assert 0 < policy.curve_scale < 0.01


def test_a_proposals_setup_time_is_no_draft_cost(tmp_path, monkeypatch):
    """A draft head compiling on its first call (dcoco.models.heads.head_compile) reports the
    seconds as
    `setup_s`: neither the policy's draft cost nor the reply's time counts them."""
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    torch.set_num_threads(1)
    target = make_tiny_target("llama")
    lookup = PromptLookupProposer(4)
    calls = []

    class CompilingOnce:
        name, feature_layers = "compiling", ()

        def start(self, prompt_ids):
            lookup.start(prompt_ids)

        def propose(self, context):
            proposal = lookup.propose(context)
            proposal.setup_s = 0.0 if calls else 0.5
            if not calls:
                time.sleep(0.5)
            calls.append(proposal.setup_s)
            return proposal

    policy = DraftLengthPolicy(FLAT, max_k=4)
    observed = []
    observe = policy.observe

    def timed(proposed, accepted, propose_s, *args):
        observed.append(propose_s)
        return observe(proposed, accepted, propose_s, *args)

    monkeypatch.setattr(policy, "observe", timed)
    prompt = torch.randint(5, 128, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    reply = Engine(target, CompilingOnce(), policy).generate(prompt, 12)
    assert calls[0] == 0.5 and reply.stats.setup_s == 0.5
    assert reply.stats.total_s < 0.5 and observed and max(observed) < 0.1
