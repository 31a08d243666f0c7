"""The corrector's options (normalised features, the successor term, slot 0 from the anchor) and
its two losses: untrained it drafts the drafter's argmax, batched scores equal a loop, the
conditional loss ignores what depends on the predecessor alone, and the walk's teacher-forced
correctness is the real walk's acceptance."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.engine import Engine
from dcoco.decode.head_proposer import HeadProposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.heads.base import Candidates, HeadBatch
from dcoco.models.heads.candidate_features import with_anchor_slot
from dcoco.models.heads.corrector import Corrector, CorrectorConfig
from dcoco.models.heads.corrector_loss import with_labels_inserted
from dcoco.models.heads.selection import SELECTION_RULES, selected_token_ids

VOCAB, HIDDEN, SLOTS, TOP_K = 40, 12, 5, 4
OPTIONS = [
    dict(features=f, successor_query=q, anchor=a)
    for f, q, a in itertools.product(("logit", "normalised"), (False, True), (False, True))
]

pytestmark = pytest.mark.usefixtures("one_thread")


def make_corrector(seed: int = 0, randomise: bool = False, **flags) -> Corrector:
    torch.manual_seed(seed)
    corrector = Corrector(
        CorrectorConfig(HIDDEN, top_k=TOP_K, mlp_hidden=8, **flags), nn.Embedding(VOCAB, HIDDEN)
    )
    if randomise:  # every zero-initialised output layer made non-zero
        with torch.no_grad():
            for name, param in corrector.named_parameters():
                if name.startswith(("delta_out", "query_out")):
                    nn.init.normal_(param)
    return corrector


def random_block(batch: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, SLOTS, HIDDEN, generator=generator)
    logits = 3 * torch.randn(batch, SLOTS, VOCAB, generator=generator)
    anchors = torch.randint(0, VOCAB, (batch,), generator=generator)
    return hidden, logits, anchors


@pytest.mark.parametrize("flags", OPTIONS)
def test_untrained_corrector_with_any_option_keeps_the_drafter_argmax(flags):
    corrector = make_corrector(**flags)
    hidden, logits, anchors = random_block(6, seed=1)
    scores = corrector(hidden, logits, anchors)
    expected = scores.candidate_logits[:, 1:, None, :].expand(-1, -1, TOP_K, -1)
    assert torch.equal(scores.transitions, expected)
    if flags["anchor"]:
        assert torch.equal(scores.start, scores.candidate_logits[:, 0])
    for rule in SELECTION_RULES.values():
        assert torch.equal(selected_token_ids(scores, rule(scores)), logits.argmax(dim=-1))


def test_a_corrector_that_reselects_slot_0_needs_the_anchor():
    hidden, logits, _ = random_block(2, seed=2)
    with pytest.raises(DcocoError, match="anchor"):
        make_corrector(anchor=True)(hidden, logits)
    with pytest.raises(DcocoError, match="loss"):
        CorrectorConfig(HIDDEN, loss="softmax")


def naive_scores(corrector: Corrector, hidden, logits, anchors):
    """(start or None, S) one (p, a, b) at a time, delta's MLP and the query on whole inputs."""
    values, ids = logits.topk(TOP_K, dim=-1)
    features = corrector.candidate_features(values, logits.logsumexp(dim=-1))
    if corrector.config.anchor:
        kind = corrector.config.features
        hidden, ids, features = with_anchor_slot(hidden, ids, features, anchors, kind)
        values = torch.cat([torch.zeros_like(values[:, :1]), values], dim=1)
    z = corrector.candidate_repr(hidden, ids)
    pair = corrector.pair_state(hidden)
    embed = corrector._shared[0]
    batch, slots = ids.shape[:2]
    scores = torch.empty(batch, slots - 1, TOP_K, TOP_K)
    for p, a, b in itertools.product(range(slots - 1), range(TOP_K), range(TOP_K)):
        inputs = torch.cat([pair[:, p], z[:, p, a], features[:, p, a], z[:, p + 1, b],
                            features[:, p + 1, b]], dim=-1)  # fmt: skip
        delta = corrector.delta_out(F.silu(corrector.delta_in(inputs)))[:, 0]
        if corrector.config.successor_query:
            query = corrector.query_out(
                F.silu(corrector.query_in(torch.cat([pair[:, p], z[:, p, a]], dim=-1)))
            )
            delta = delta + (query * embed(ids[:, p + 1, b])).sum(-1) / HIDDEN**0.5
        scores[:, p, a, b] = values[:, p + 1, b] + delta
    if corrector.config.anchor:
        return scores[:, 0, 0], scores[:, 1:]
    return None, scores


@pytest.mark.parametrize("flags", OPTIONS)
def test_batched_scores_equal_the_naive_loop(flags):
    corrector = make_corrector(randomise=True, **flags)
    hidden, logits, anchors = random_block(3, seed=5)
    with torch.no_grad():
        scores = corrector(hidden, logits, anchors)
        start, naive = naive_scores(corrector, hidden, logits, anchors)
    torch.testing.assert_close(scores.transitions, naive, rtol=0, atol=1e-5)
    if start is not None:
        torch.testing.assert_close(scores.start, start, rtol=0, atol=1e-5)


def head_batch(hidden, logits, anchors, labels) -> HeadBatch:
    values, ids = logits.topk(TOP_K, dim=-1)
    return HeadBatch(
        hidden=hidden, logits=logits, vocab_ids=None, anchor_ids=anchors, label_ids=labels,
        label_index=labels, slot_weights=torch.linspace(1.0, 0.5, SLOTS),
        candidates=Candidates(ids, values, logits.logsumexp(dim=-1),
                              logits.gather(-1, labels[..., None]).squeeze(-1)),
    )  # fmt: skip


def labels_near_the_top(logits, seed: int):
    """Labels drawn from each slot's top-(K + 1), so some are missing from the top-K."""
    generator = torch.Generator().manual_seed(seed)
    ranked = logits.topk(TOP_K + 1, dim=-1).indices
    pick = torch.randint(0, TOP_K + 1, ranked.shape[:2], generator=generator)
    pick[:, :2] = torch.randint(0, 2, (ranked.shape[0], 2), generator=generator)  # often top-1
    return ranked.gather(-1, pick[..., None]).squeeze(-1)


def test_a_predecessor_only_term_leaves_the_conditional_loss_unchanged(monkeypatch):
    hidden, logits, anchors = random_block(16, seed=3)
    labels = labels_near_the_top(logits, seed=3)
    losses = {}
    for loss, shifted in itertools.product(("conditional", "pairs"), (False, True)):
        corrector = make_corrector(randomise=True, loss=loss, anchor=True)
        if shifted:  # + c[p, a]: a term of S that depends only on the candidate at slot p
            score = corrector.score
            bump = 5 * torch.randn(
                16, SLOTS - 1, TOP_K, 1, generator=torch.Generator().manual_seed(9)
            )

            def shifted_score(*args, score=score, bump=bump):
                scores = score(*args)
                scores.transitions = scores.transitions + bump
                return scores

            monkeypatch.setattr(corrector, "score", shifted_score)
        losses[loss, shifted] = corrector.training_loss(head_batch(hidden, logits, anchors, labels))
    conditional, moved = losses["conditional", False], losses["conditional", True]
    torch.testing.assert_close(conditional.weighted_loss, moved.weighted_loss)
    assert torch.equal(conditional.correct, moved.correct)  # the walk reads the same argmax
    assert not torch.allclose(
        losses["pairs", False].weighted_loss, losses["pairs", True].weighted_loss
    )
    parts = losses["pairs", False].parts  # -log P(a*, b*) = which_a + b_given_a (+ start)
    total = parts["which_a"] + parts["b_given_a"] + parts["start"]
    torch.testing.assert_close(total, losses["pairs", False].weighted_loss.detach())


def test_missing_labels_are_written_into_the_last_candidate_with_their_logit():
    ids = torch.tensor([[[5, 6, 7], [1, 2, 3]]])
    candidates = Candidates(ids, torch.tensor([[[3.0, 2.0, 1.0], [4.0, 3.0, 2.0]]]),
                            torch.zeros(1, 2), torch.tensor([[2.0, -1.5]]))  # fmt: skip
    inserted, where = with_labels_inserted(candidates, torch.tensor([[6, 9]]))
    assert inserted.ids.tolist() == [[[5, 6, 7], [1, 2, 9]]]
    assert inserted.logits[0, 1].tolist() == [4.0, 3.0, -1.5]
    assert where.tolist() == [[1, 2]]
    assert ids.tolist() == [[[5, 6, 7], [1, 2, 3]]]  # the input is not modified


@pytest.mark.parametrize("loss", ["conditional", "pairs"])
@pytest.mark.parametrize("anchor", [False, True])
def test_teacher_forced_correctness_is_the_real_walks_acceptance(loss, anchor):
    corrector = make_corrector(randomise=True, loss=loss, anchor=anchor, features="normalised")
    hidden, logits, anchors = random_block(64, seed=4)
    labels = labels_near_the_top(logits, seed=4)
    with torch.no_grad():
        correct = corrector.training_loss(head_batch(hidden, logits, anchors, labels)).correct
        drafted = corrector.select(hidden, logits, anchors)
    accepted = (drafted == labels).long().cumprod(dim=1).sum(dim=1)
    assert torch.equal(correct.long().cumprod(dim=1).sum(dim=1), accepted)
    assert 0 < accepted.float().mean() < SLOTS  # neither trivial nor perfect


def test_untrained_anchor_corrector_drafts_like_dflash_in_the_engine(tiny_target):
    config = DrafterConfig.for_target(tiny_target, num_layers=1, block_size=6, mask_token_id=3,
                                      target_layer_ids=(0, 1, 3))  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, tiny_target.embed_tokens, tiny_target.lm_head)
    corrector = Corrector(
        CorrectorConfig(config.hidden_size, top_k=8, mlp_hidden=16, features="normalised",
                        successor_query=True, anchor=True),
        tiny_target.embed_tokens,
    )  # fmt: skip
    prompt = torch.randint(5, 128, (8,), generator=torch.Generator().manual_seed(3)).tolist()
    plain = Engine(tiny_target).generate(prompt, 24)
    corrected = Engine(tiny_target, HeadProposer(drafter, corrector)).generate(prompt, 24)
    dflash = Engine(tiny_target, DFlashProposer(drafter)).generate(prompt, 24)
    assert corrected.new_ids == plain.new_ids
    assert corrected.stats.accept_lengths == dflash.stats.accept_lengths


def counted_corrector(randomise: bool, **flags) -> Corrector:
    """A corrector reading the pair counts of a few replies over the test vocabulary."""
    from dcoco.data.bigram import successor_log_probs
    from dcoco.data.distill import Sample

    replies = [Sample("a", (1,), (5, 6, 7, 5, 6, 9)), Sample("b", (2,), (6, 7, 8, 5, 6))]
    table = successor_log_probs(replies, VOCAB)
    corrector = make_corrector(randomise, pair_counts=table[0].numel(), vocab_size=VOCAB, **flags)
    corrector.pair_counts.fill(*table)
    if randomise:
        with torch.no_grad():
            nn.init.normal_(corrector.bigram_scale)
    return corrector


def test_pair_counts_are_smoothed_successor_frequencies():
    corrector = counted_corrector(False)
    counts = corrector.pair_counts
    got = counts(torch.tensor([5, 6, 3]), torch.tensor([6, 9, 7]))  # [3, 3]
    denominator = {
        5: 3 + 0.01 * VOCAB,
        6: 3 + 0.01 * VOCAB,
        3: 0.01 * VOCAB,
    }  # 6 -> 7 twice, -> 9 once
    assert got[0, 0].item() == pytest.approx(torch.tensor((3 + 0.01) / denominator[5]).log().item())
    assert got[1, 2].item() == pytest.approx(torch.tensor((2 + 0.01) / denominator[6]).log().item())
    assert got[2, 1].item() == pytest.approx(torch.tensor(0.01 / denominator[3]).log().item())


@pytest.mark.parametrize("anchor", [False, True])
def test_a_counted_corrector_starts_at_the_argmax_and_adds_its_scaled_counts(anchor):
    hidden, logits, anchors = random_block(4, seed=6)
    untrained = counted_corrector(False, anchor=anchor)
    scores = untrained(hidden, logits, anchors)
    assert torch.equal(
        scores.transitions, scores.candidate_logits[:, 1:, None, :].expand(-1, -1, TOP_K, -1)
    )
    corrector = counted_corrector(True, anchor=anchor)  # delta_out = 0 except the counted term
    with torch.no_grad():
        nn.init.zeros_(corrector.delta_out.weight)
        nn.init.zeros_(corrector.delta_out.bias)
        scores = corrector(hidden, logits, anchors)
    ids = scores.candidate_ids
    if anchor:
        ids = torch.cat([anchors[:, None, None].expand(-1, 1, TOP_K), ids], dim=1)
    counted = corrector.pair_counts(ids[:, :-1], ids[:, 1:])  # [batch, pairs, K, K]
    scale = corrector.bigram_scale[: counted.shape[1]][None, :, None, None]
    want = scores.candidate_logits[:, 0 if anchor else 1 :, None, :] + scale * counted
    got = scores.transitions
    if anchor:  # the start row is the anchor's (every row of its grid is the same)
        got = torch.cat([scores.start[:, None, None].expand(-1, 1, TOP_K, -1), got], dim=1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_pair_counts_survive_a_checkpoint_round_trip(tiny_llama_target, tmp_path):
    from dcoco.models.heads.head_io import load_head, save_with_head

    config = DrafterConfig.for_target(tiny_llama_target, num_layers=1, block_size=4,
                                      mask_token_id=3, target_layer_ids=(0, 1))  # fmt: skip
    drafter = BlockDrafter(config, tiny_llama_target.embed_tokens, tiny_llama_target.lm_head)
    from dcoco.data.bigram import successor_log_probs
    from dcoco.data.distill import Sample

    table = successor_log_probs([Sample("a", (1,), (100, 101, 102, 100, 101))], 128)
    corrector = Corrector(
        CorrectorConfig(64, top_k=4, mlp_hidden=8, pair_counts=table[0].numel(), vocab_size=128),
        tiny_llama_target.embed_tokens,
    )
    corrector.pair_counts.fill(*table)
    path = save_with_head(tmp_path / "ckpt", drafter, corrector, tiny_llama_target.info)
    loaded = load_head(path, tiny_llama_target, drafter)
    assert torch.equal(loaded.pair_counts.codes, table[0])  # int64, not rounded through bf16
    torch.testing.assert_close(loaded.pair_counts.log_probs, table[1], rtol=1e-2, atol=0)
