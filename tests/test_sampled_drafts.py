"""Drafts sampled from the drafter's distribution: a proper q over the whole vocabulary, the
target's distribution kept by the engine, argmax drafts for greedy requests."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_target

from dcoco.contracts import SamplingParams
from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.engine import Engine
from dcoco.decode.head_proposer import HeadProposer
from dcoco.decode.proposers import DraftContext
from dcoco.decode.sampled_drafts import sampled_proposal
from dcoco.decode.sampling import logits_to_probs
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.heads.corrector import Corrector, CorrectorConfig

TAPS = (0, 1, 3)
VOCAB = 128
pytestmark = pytest.mark.usefixtures("one_thread")


def make_drafter(target) -> BlockDrafter:
    config = DrafterConfig.for_target(target, num_layers=1, block_size=4, mask_token_id=3,
                                      target_layer_ids=TAPS)  # fmt: skip
    torch.manual_seed(0)
    return BlockDrafter(config, target.embed_tokens, target.lm_head)


def test_a_sampled_proposal_is_a_distribution_over_the_whole_vocabulary():
    generator = torch.Generator().manual_seed(0)
    columns = torch.tensor([2, 5, 11, 40, 90])
    logits = torch.randn(1, 3, len(columns), generator=generator)  # [batch, slots, columns]
    sampling = SamplingParams(temperature=0.7, top_k=3)
    proposal = sampled_proposal(logits, columns, VOCAB, sampling, generator)
    probs = proposal.draft_probs  # [1, 3, VOCAB]
    assert probs.shape == (1, 3, VOCAB)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 3))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[columns] = False
    assert probs[..., outside].abs().max() == 0
    torch.testing.assert_close(probs[..., columns], logits_to_probs(logits, sampling))
    assert (probs.gather(-1, proposal.draft_tokens[..., None]) > 0).all()  # drawn from q


def test_draws_follow_the_drafters_distribution():
    generator = torch.Generator().manual_seed(1)
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]])  # [1, 1, 4]
    sampling = SamplingParams(temperature=1.0)
    draws = torch.stack(
        [sampled_proposal(logits, None, 4, sampling, generator).draft_tokens for _ in range(4000)]
    ).flatten()
    frequency = torch.bincount(draws, minlength=4).float() / len(draws)
    torch.testing.assert_close(frequency, logits.softmax(-1).flatten(), atol=0.03, rtol=0)


def _joint_of_first(target, sampling, prompt, count: int) -> dict[tuple[int, ...], float]:
    """The target's probability of every sequence of its first `count` sampled tokens."""
    joint = {(): 1.0}
    for _ in range(count):
        longer = {}
        for prefix, mass in joint.items():
            logits = target.forward(torch.tensor([prompt + list(prefix)])).logits[0, -1]
            probs = logits_to_probs(logits, sampling)
            for token in probs.nonzero().flatten().tolist():
                longer[(*prefix, token)] = mass * float(probs[token])
        joint = longer
    return joint


def _proposer(target) -> DFlashProposer:
    drafter = make_drafter(target)
    drafter.use_draft_vocab(torch.arange(0, VOCAB, 2))  # drafts only ever even tokens
    return DFlashProposer(drafter, num_draft_tokens=2, sampled_drafts=True)


def test_sampled_drafts_keep_the_targets_distribution():
    """The first three new tokens jointly follow the target (top-k 3, T = 1) when the last two
    were drafted by a random drafter over a draft vocabulary and verified against its q."""
    target = make_tiny_target("llama", vocab_size=VOCAB)
    sampling = SamplingParams(temperature=1.0, top_k=3)
    prompt = [5, 17, 33, 17]
    engine = Engine(target, _proposer(target))
    expected = _joint_of_first(target, sampling, prompt, 3)
    runs, counts, drafted = 3000, {}, 0
    for seed in range(runs):
        result = engine.generate(prompt, 3, sampling, seed=seed)
        counts[tuple(result.new_ids)] = counts.get(tuple(result.new_ids), 0) + 1
        drafted += sum(result.stats.reached_per_slot)
    assert drafted >= runs  # every reply's second and third tokens went through a draft
    assert set(counts) <= set(expected)
    total_variation = 0.5 * sum(abs(counts.get(k, 0) / runs - p) for k, p in expected.items())
    assert total_variation < 0.07, total_variation


def test_sampled_drafts_land():
    """Over the whole vocabulary q and p always overlap: some sampled drafts are accepted."""
    target = make_tiny_target("llama", vocab_size=VOCAB)
    engine = Engine(target, _proposer(target))
    accepted = sum(
        sum(engine.generate([5, 17, 33, 17], 12, SamplingParams(temperature=1.0), seed=seed)
            .stats.accepted_per_slot)
        for seed in range(20)
    )  # fmt: skip
    assert accepted > 0


@pytest.mark.parametrize("with_head", [False, True])
def test_greedy_requests_and_the_off_switch_draft_deterministically(with_head):
    target = make_tiny_target("llama", vocab_size=VOCAB)
    drafter = make_drafter(target)
    ids = torch.tensor([5, 17, 33, 17, 40, 41])
    features = target.forward(ids[None], target.new_cache(), feature_layers=TAPS).features

    def proposal(sampled_drafts: bool, sampling: SamplingParams):
        if with_head:
            corrector = Corrector(CorrectorConfig(drafter.config.hidden_size, top_k=4,
                                                  mlp_hidden=8), target.embed_tokens)  # fmt: skip
            proposer = HeadProposer(drafter, corrector, sampled_drafts=sampled_drafts)
        else:
            proposer = DFlashProposer(drafter, sampled_drafts=sampled_drafts)
        context = DraftContext(ids, features[:, :-1], 3, sampling, torch.Generator())
        return proposer.propose(context)

    greedy, sampled = SamplingParams(), SamplingParams(temperature=1.0)
    reference = proposal(False, greedy).draft_tokens
    assert proposal(False, greedy).draft_probs is None
    assert torch.equal(proposal(True, greedy).draft_tokens, reference)  # greedy: never sampled
    assert proposal(True, greedy).draft_probs is None
    assert torch.equal(proposal(False, sampled).draft_tokens, reference)  # switched off
    assert proposal(True, sampled).draft_probs is not None
