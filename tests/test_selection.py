"""Selection rules against plain-Python references: the greedy walk, and Viterbi (plain and
discounted) against brute force over every path."""

from __future__ import annotations

import itertools

import pytest
import torch

from dcoco.models.heads.selection import (
    DEFAULT_GAMMA,
    SELECTION_RULES,
    Scores,
    best_path,
    discounted_path,
    greedy,
    selected_token_ids,
    top1,
)


def random_scores(batch: int, slots: int, top_k: int, seed: int = 0) -> Scores:
    """fp64, so the float sums of the references cannot flip a near-tie."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, slots, top_k, generator=generator, dtype=torch.float64)
    return Scores(
        candidate_ids=torch.randint(0, 1000, (batch, slots, top_k), generator=generator),
        candidate_logits=logits.sort(dim=-1, descending=True).values,
        transitions=torch.randn(
            batch, slots - 1, top_k, top_k, generator=generator, dtype=torch.float64
        ),
    )


def reference_greedy(scores: Scores) -> list[list[int]]:
    batch, slots, top_k = scores.candidate_ids.shape
    paths = []
    for row in range(batch):
        path = [0]
        for p in range(slots - 1):
            step = [float(scores.transitions[row, p, path[-1], b]) for b in range(top_k)]
            path.append(max(range(top_k), key=step.__getitem__))
        paths.append(path)
    return paths


def brute_force(scores: Scores, weights: list[float]) -> list[list[int]]:
    """The best of all K^slots paths under weights[0] L[0, k0] + sum_p weights[p+1] S[p, ...]."""
    batch, slots, top_k = scores.candidate_ids.shape
    logits, transitions = scores.candidate_logits.tolist(), scores.transitions.tolist()
    paths = []
    for row in range(batch):

        def path_score(path, row=row):
            total = weights[0] * logits[row][0][path[0]]
            for p in range(slots - 1):
                total += weights[p + 1] * transitions[row][p][path[p]][path[p + 1]]
            return total

        paths.append(list(max(itertools.product(range(top_k), repeat=slots), key=path_score)))
    return paths


def test_greedy_matches_a_hand_written_walk():
    scores = random_scores(batch=6, slots=7, top_k=5)
    assert greedy(scores).tolist() == reference_greedy(scores)


def test_keep1_walks_from_the_drafters_top1_whatever_the_start_scores():
    scores = random_scores(batch=6, slots=7, top_k=5)
    started = Scores(**{**scores.__dict__, "start": torch.randn(6, 5, dtype=torch.float64)})
    assert greedy(started)[:, 0].tolist() == started.start.argmax(dim=-1).tolist()
    assert SELECTION_RULES["keep1"](started).tolist() == reference_greedy(scores)


def test_global_matches_brute_force():
    scores = random_scores(batch=8, slots=4, top_k=3, seed=1)
    assert best_path(scores).tolist() == brute_force(scores, [1.0] * 4)
    # the test means something only if the best path is not always the greedy one
    assert not torch.equal(best_path(scores), greedy(scores))


@pytest.mark.parametrize("gamma", [0.8, 0.3])
def test_discounted_matches_brute_force(gamma):
    scores = random_scores(batch=8, slots=4, top_k=3, seed=2)
    weights = [gamma**p for p in range(4)]
    assert discounted_path(scores, gamma).tolist() == brute_force(scores, weights)


def test_discount_changes_the_choice():
    scores = random_scores(batch=16, slots=4, top_k=3, seed=3)
    assert not torch.equal(discounted_path(scores, 0.3), best_path(scores))


def test_top1_and_token_ids():
    scores = random_scores(batch=2, slots=3, top_k=4)
    indices = top1(scores)
    assert indices.shape == (2, 3) and indices.dtype == torch.long and not indices.any()
    assert torch.equal(selected_token_ids(scores, indices), scores.candidate_ids[..., 0])
    chosen = torch.tensor([[1, 3, 0], [2, 2, 1]])
    ids = scores.candidate_ids
    expected = [[int(ids[row, p, chosen[row, p]]) for p in range(3)] for row in range(2)]
    assert selected_token_ids(scores, chosen).tolist() == expected


@pytest.mark.parametrize("slots", [1, 5])
@pytest.mark.parametrize("rule", sorted(SELECTION_RULES))
def test_every_rule_picks_the_path_its_objective_names(rule, slots):
    scores = random_scores(batch=3, slots=slots, top_k=4, seed=slots)
    indices = SELECTION_RULES[rule](scores)
    assert indices.dtype == torch.long
    expected = {
        "top1": [[0] * slots for _ in range(3)],
        "greedy": reference_greedy(scores),
        "keep1": reference_greedy(scores),
        "global": brute_force(scores, [1.0] * slots),
        "discounted": brute_force(scores, [DEFAULT_GAMMA**p for p in range(slots)]),
    }[rule]
    assert indices.tolist() == expected
    if slots == 1:  # one slot has no transitions: every rule keeps the drafter's top-1
        assert not indices.any()
