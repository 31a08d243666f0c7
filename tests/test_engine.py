"""The engine against the slow reference decoder, cache rollback, stop handling and bad input."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_target

from dcoco.contracts import Proposal, SamplingParams
from dcoco.decode.engine import Engine
from dcoco.decode.proposers import PromptLookupProposer
from dcoco.decode.reference import reference_greedy
from dcoco.errors import DcocoError
from dcoco.models.target.cache import crop_cache

PROMPT = [5, 17, 33, 17, 33, 9, 64, 17, 33, 9]


class OracleProposer:
    """Drafts the reference continuation, corrupting some slots: exercises partial acceptance."""

    name = "oracle"
    feature_layers = (1, 2)

    def __init__(self, reference: list[int], corrupt_every: int, slots: int = 5):
        self.reference, self.corrupt_every, self.slots = reference, corrupt_every, slots
        self.prompt_len = 0
        self.cycle = 0

    def start(self, prompt_ids):
        self.prompt_len = len(prompt_ids)

    def propose(self, context):
        assert context.new_features is not None and context.new_features.shape[-1] == 2 * 64
        done = context.tokens.shape[0] - self.prompt_len
        draft = list(self.reference[done : done + min(self.slots, context.max_slots)])
        self.cycle += 1
        if draft and self.cycle % self.corrupt_every == 0:
            draft[len(draft) // 2] = (draft[len(draft) // 2] + 1) % 128
        return Proposal(draft_tokens=torch.tensor([draft], dtype=torch.long))


class RandomProposer:
    name = "random"
    feature_layers = ()

    def start(self, prompt_ids):
        self.generator = torch.Generator().manual_seed(1)

    def propose(self, context):
        slots = min(4, context.max_slots)
        return Proposal(draft_tokens=torch.randint(0, 128, (1, slots), generator=self.generator))


@pytest.mark.parametrize("max_new", [1, 7, 40])
def test_greedy_equals_reference_for_every_proposer(tiny_target, max_new):
    reference = reference_greedy(tiny_target, PROMPT, max_new)
    proposers = [
        None,
        PromptLookupProposer(6),
        RandomProposer(),
        OracleProposer(reference, corrupt_every=2),
        OracleProposer(reference, 10**9),
    ]
    for proposer in proposers:
        result = Engine(tiny_target, proposer).generate(PROMPT, max_new)
        assert result.new_ids == reference, getattr(proposer, "name", "plain")
        assert len(result.new_ids) <= max_new


def test_oracle_drafts_are_accepted(tiny_target):
    reference = reference_greedy(tiny_target, PROMPT, 40)
    stats = Engine(tiny_target, OracleProposer(reference, 10**9)).generate(PROMPT, 40).stats
    assert stats.tau == pytest.approx(6.0, abs=0.5)  # 5 drafts + bonus per cycle
    plain = Engine(tiny_target).generate(PROMPT, 40).stats
    assert plain.tau == 1.0 and plain.cycles == 39  # first token comes from the prefill


def test_stop_id_ends_generation():
    target = make_tiny_target("llama")
    reference = reference_greedy(target, PROMPT, 30)
    stop = reference[12]
    target.stop_ids = frozenset({stop})
    expected = reference[: reference.index(stop) + 1]
    for proposer in (None, PromptLookupProposer(6), OracleProposer(reference, 3)):
        result = Engine(target, proposer).generate(PROMPT, 30)
        assert result.new_ids == expected and result.finish_reason == "stop"


def test_cache_rollback_equals_never_seeing_rejected_tokens(tiny_target):
    prefix = torch.tensor([PROMPT])
    rolled = tiny_target.new_cache()
    tiny_target.forward(prefix, rolled)
    tiny_target.forward(torch.tensor([[7, 8, 9, 10]]), rolled)  # 2 accepted, 2 rejected
    crop_cache(rolled, len(PROMPT) + 2)
    clean = tiny_target.new_cache()
    tiny_target.forward(torch.cat([prefix, torch.tensor([[7, 8]])], dim=1), clean)
    assert rolled.get_seq_length() == clean.get_seq_length()
    for got, want in zip(rolled.layers, clean.layers, strict=True):
        torch.testing.assert_close(got.keys, want.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.values, want.values, rtol=1e-5, atol=1e-5)
    # the next step after rollback matches a fresh forward
    after = tiny_target.forward(torch.tensor([[11]]), rolled).logits
    fresh = tiny_target.forward(torch.tensor([PROMPT + [7, 8, 11]])).logits[:, -1:]
    torch.testing.assert_close(after, fresh, rtol=1e-4, atol=1e-4)


def test_sampled_tokens_follow_the_target_distribution():
    """Sampling with a proposer: the first two new tokens jointly follow the target (top-k 3)."""
    target = make_tiny_target("llama", vocab_size=128)
    sampling = SamplingParams(temperature=1.0, top_k=3)
    prompt = PROMPT[:4]

    class FixedProposer:  # always drafts a token the target ranks second: rejected often
        name, feature_layers = "fixed", ()

        def start(self, prompt_ids):
            pass

        def propose(self, context):
            logits = target.forward(context.tokens[None]).logits[0, -1]
            return Proposal(draft_tokens=logits.topk(2).indices[1:].view(1, 1))

    from dcoco.decode.sampling import logits_to_probs

    first_probs = logits_to_probs(target.forward(torch.tensor([prompt])).logits[0, -1], sampling)
    expected = {}
    for first in first_probs.nonzero().flatten().tolist():
        logits = target.forward(torch.tensor([prompt + [first]])).logits[0, -1]
        second = logits_to_probs(logits, sampling)
        for token in second.nonzero().flatten().tolist():
            expected[(first, token)] = float(first_probs[first] * second[token])
    runs = 1500
    counts: dict[tuple[int, int], int] = {}
    engine = Engine(target, FixedProposer())
    for seed in range(runs):
        ids = engine.generate(prompt, 2, sampling, seed=seed).new_ids
        counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1
    assert set(counts) <= set(expected)
    total_variation = 0.5 * sum(abs(counts.get(k, 0) / runs - p) for k, p in expected.items())
    assert total_variation < 0.06, total_variation


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_new_tokens=0), "max-new-tokens"),
        (dict(prompt=list(range(3, 300))), "context"),
        (dict(prompt=[5, 999]), "token ids"),
        (dict(prompt=[]), "empty"),
    ],
)
def test_bad_requests_raise_clear_errors(kwargs, message):
    target = make_tiny_target("llama")
    prompt = kwargs.pop("prompt", PROMPT)
    with pytest.raises(DcocoError, match=message):
        Engine(target).generate(prompt, **{"max_new_tokens": 8, **kwargs})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top-p"),
        (dict(top_p=1.5), "top-p"),
        (dict(top_k=-1), "top-k"),
    ],
)
def test_invalid_sampling_parameters(kwargs, message):
    with pytest.raises(DcocoError, match=message):
        SamplingParams(**kwargs)


def test_budget_is_clamped_to_the_context():
    target = make_tiny_target("llama")
    prompt = [(7 * i) % 120 + 3 for i in range(247)]
    result = Engine(target, PromptLookupProposer(8)).generate(prompt, 100)
    assert len(prompt) + len(result.new_ids) <= target.max_context
    assert result.new_ids == reference_greedy(target, prompt, 100)
