"""Copy hints: prompt lookup's match, no future tokens, and training == decoding with hints."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.engine import Engine
from dcoco.decode.hybrid_proposer import HybridProposer
from dcoco.decode.proposers import DraftContext
from dcoco.models.drafter.copy_hints import (
    MAX_NGRAM,
    MIN_NGRAM,
    NO_HINT,
    ContextMatcher,
    add_copy_bonus,
    context_hints,
    hints_at,
    last_match,
    match_length,
    match_table,
)
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import load_drafter, save_drafter
from dcoco.models.target.cache import cache_length
from dcoco.train.block_pass import Item, LossVocab, block_chunks, chunk_losses

BLOCK = 5


def brute_follow(ids: list[int], i: int) -> int:
    """After the most recent earlier occurrence of the longest n-gram ending at i, by search."""
    for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
        if i + 1 < n:
            continue
        suffix = ids[i + 1 - n : i + 1]
        for end in range(i - 1, n - 2, -1):
            if ids[end + 1 - n : end + 1] == suffix:
                return end + 1
    return NO_HINT


def test_match_table_and_last_match_equal_a_brute_force_search():
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        table = match_table(ids)
        assert table == [brute_follow(ids, i) for i in range(len(ids))]
        assert last_match(torch.tensor(ids)) == table[-1]


def test_match_length_is_the_longest_repeated_suffix():
    rng = random.Random(1)
    for _ in range(50):
        ids = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        repeated = [
            n
            for n in range(1, min(MAX_NGRAM, len(ids) - 1) + 1)
            if any(ids[s : s + n] == ids[-n:] for s in range(len(ids) - n))
        ]
        assert match_length(torch.tensor(ids)) == max(repeated, default=0), ids
    assert match_length(torch.tensor([1, 2, 3])) == 0
    assert match_length(torch.tensor([1, 2, 3, 1, 2])) == 2


def test_hints_continue_a_loop_shorter_than_the_block():
    ids = [9, 5, 6, 7, 5, 6]  # the bigram (5, 6) was last seen ending at position 2
    assert context_hints(torch.tensor(ids), 6).tolist() == [7, 5, 6, 7, 5, 6]
    no_match = context_hints(torch.tensor([9, 5, 6, 7]), 3).tolist()
    assert no_match == [NO_HINT] * 3  # no earlier bigram: MASK stays


def test_a_matcher_over_a_growing_reply_gives_the_whole_contexts_hints():
    rng = random.Random(2)
    for _ in range(10):
        ids = torch.tensor([rng.randrange(4) for _ in range(rng.randrange(2, 60))])
        matcher, length = ContextMatcher(), 1
        while length <= len(ids):  # grown by 1-4 tokens a call, as a decoding cycle commits
            for repeat in range(2):  # asked again with nothing new: the same hints
                got = matcher.hints(ids[:length], 5)
                assert torch.equal(got, context_hints(ids[:length], 5)), (ids, length, repeat)
            length += rng.randrange(1, 5)
        other = torch.tensor([3, 2, 1, 3, 2])  # not a continuation: starts over
        assert torch.equal(matcher.hints(other, 4), context_hints(other, 4))


def test_hints_read_no_token_after_the_anchor():
    rng = random.Random(1)
    ids = [rng.randrange(3) for _ in range(60)]
    anchor = 31
    base = hints_at(ids, match_table(ids), anchor, 7)
    changed = ids[: anchor + 1] + [rng.randrange(3) + 3 for _ in ids[anchor + 1 :]]
    assert hints_at(changed, match_table(changed), anchor, 7) == base
    assert base != [NO_HINT] * 7


def hinted_drafter(target, gated: bool = False) -> BlockDrafter:
    """A copy-hint drafter; `gated`: with a copy gate set to random weights (a trained one's
    bonus is far from zero), so that tests see the bonus move drafts."""
    config = DrafterConfig.for_target(
        target, block_size=BLOCK, mask_token_id=3, target_layer_ids=(0, 1, 3)
    )
    torch.manual_seed(0)
    config = dataclasses.replace(config, copy_hints=True)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head).eval()
    if gated:
        drafter.add_copy_gate()
        torch.nn.init.normal_(drafter.copy_gate.weight, std=1.0)
        torch.nn.init.constant_(drafter.copy_gate.bias, 5.0)
    return drafter


def repetitive_ids() -> torch.Tensor:
    phrase = [10, 11, 12, 13, 14, 15, 16]
    return torch.tensor([[4, 5, *phrase, 6, *phrase, 7, *phrase, 8, 9, 10, 11]])  # [1, 35]


@pytest.mark.parametrize("gated", [False, True])
def test_training_pass_equals_decoding_with_hints(tiny_llama_target, gated):
    """The blocks trained side by side == the proposer's successive drafts, hints (and the copy
    gate's bonus) included."""
    target, ids = tiny_llama_target, repetitive_ids()
    drafter = hinted_drafter(target, gated)
    features = target.forward(ids, feature_layers=(0, 1, 3), with_logits=False).features.clone()
    anchors = [13, 21]  # both inside a repeat: every slot hinted
    assert all(NO_HINT not in context_hints(ids[0, : a + 1], BLOCK - 1).tolist() for a in anchors)
    item = Item(ids=ids[0], features=features, anchors=torch.tensor(anchors))
    with torch.no_grad():
        chunks = list(block_chunks(drafter, item, 8))
        trained = torch.cat([chunk.hidden for chunk in chunks])
        trained_logits = torch.cat([drafter.logits(c.hidden, c.hint_ids) for c in chunks])
    proposer = DFlashProposer(drafter)
    proposer.start(ids[0, :1].tolist())
    seen = 0
    for index, anchor in enumerate(anchors):
        context = DraftContext(ids[0, : anchor + 1], features[:, seen:anchor], BLOCK - 1)
        logits, hidden = proposer.draft_block(context)
        torch.testing.assert_close(hidden[0], trained[index], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits[0], trained_logits[index], atol=1e-4, rtol=1e-5)
        seen = anchor
    unhinted = dataclasses.replace(drafter.config, copy_hints=False, copy_gate=False)
    plain = BlockDrafter(unhinted, target.embed_tokens, target.lm_head).eval()
    ungated = {k: v for k, v in drafter.state_dict().items() if not k.startswith("copy_gate.")}
    plain.load_state_dict(ungated)
    with torch.no_grad():
        masked = torch.cat([chunk.hidden for chunk in block_chunks(plain, item, 8)])
    assert not torch.allclose(masked, trained)  # the hints do reach the slots


@pytest.mark.parametrize("gated", [False, True])
def test_copy_hints_survive_a_checkpoint_round_trip(tiny_llama_target, tmp_path, gated):
    target, drafter = tiny_llama_target, hinted_drafter(tiny_llama_target, gated)
    path = save_drafter(tmp_path / "hinted", drafter, target.info, dtype=torch.float32)
    loaded = load_drafter(path, target, dtype=torch.float32)
    assert loaded.config.copy_hints and loaded.config.copy_gate == gated
    for name, weight in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], weight, rtol=0, atol=0)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_bonus_lands_on_the_hint_column_only(fused, dtype):
    logits = torch.randn(2, 3, 40).to(dtype)
    hints = torch.tensor([[4, NO_HINT, 0], [NO_HINT, NO_HINT, 39]])
    bonus = torch.tensor([[1.5, 2.0, -1.0], [3.0, 3.0, 0.5]])
    expected = logits.float().clone()
    expected[0, 0, 4] += 1.5
    expected[0, 2, 0] -= 1.0
    expected[1, 2, 39] += 0.5
    before = logits.clone()
    out = add_copy_bonus(logits, bonus, hints, fused=fused)
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert torch.equal(logits, before)  # the input is left as it was


def test_a_new_copy_gate_changes_nothing_and_then_learns(tiny_llama_target):
    """Zero at the start (an init's drafts are kept); the loss reaches it through a loss-vocab
    shortlist, and a hint outside the shortlist gets no bonus there."""
    target, ids = tiny_llama_target, repetitive_ids()
    drafter = hinted_drafter(target).train()
    features = target.forward(ids, feature_layers=(0, 1, 3), with_logits=False).features.clone()
    item = Item(ids=ids[0], features=features, anchors=torch.tensor([13, 21]))
    chunk = next(block_chunks(drafter, item, 8))
    before = drafter.logits(chunk.hidden, chunk.hint_ids)
    drafter.add_copy_gate()
    torch.testing.assert_close(drafter.logits(chunk.hidden, chunk.hint_ids), before.float())
    weights = torch.ones(BLOCK - 1)
    for shortlist, learns in ((range(4, 20), True), (range(17, 30), False)):
        drafter.zero_grad()
        vocab = LossVocab(drafter, torch.tensor(list(shortlist)))
        chunk = next(block_chunks(drafter, item, 8))  # hints 10..16: inside the first only
        chunk_losses(drafter, None, chunk, vocab, weights, 0.0, True).drafter_loss.backward()
        assert (drafter.copy_gate.weight.grad.abs().sum() > 0) == learns


def test_hybrid_and_hinted_drafters_keep_greedy_output(tiny_llama_target):
    """pld-dflash and a copy-hint drafter in the engine: fp32 greedy output is plain's, and
    the hybrid's drafter, skipped in lookup cycles, drafts as if it had read every tap."""
    target = tiny_llama_target
    drafter = hinted_drafter(target)
    gated = hinted_drafter(target, gated=True)
    repeat = repetitive_ids()[0].tolist()[:20]  # a prompt that repeats itself: lookup cycles
    for prompt in (repeat, list(range(5, 13))):
        plain = Engine(target).generate(prompt, 30)
        proposers = (
            DFlashProposer(drafter),
            DFlashProposer(gated),
            HybridProposer(DFlashProposer(drafter)),
        )
        for proposer in proposers:
            assert Engine(target, proposer).generate(prompt, 30).new_ids == plain.new_ids
    hybrid, fresh = HybridProposer(DFlashProposer(drafter)), DFlashProposer(drafter)
    ids = repetitive_ids()
    features = target.forward(ids, feature_layers=(0, 1, 3), with_logits=False).features.clone()
    hybrid.start([])
    fresh.start([])
    lookup = hybrid.propose(DraftContext(ids[0, :14], features[:, :13], BLOCK - 1))
    assert lookup.draft_tokens[0].tolist() == [14, 15, 16, 6]  # what followed (12, 13) before
    # Anchor 26 (the bigram 8, 9 is new): the drafter's turn, over the taps it skipped as well.
    drafted = hybrid.propose(DraftContext(ids[0, :27], features[:, 13:26], BLOCK - 1))
    expected = fresh.propose(DraftContext(ids[0, :27], features[:, :26], BLOCK - 1))
    assert torch.equal(drafted.draft_tokens, expected.draft_tokens)
    assert cache_length(hybrid.dflash.cache) == 26  # every context position, none dropped
