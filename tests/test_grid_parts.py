"""The prefix-first walk from one row per slot pair (dcoco.models.heads.grid_parts): each row it
computes has the bits of the whole grid's row, so outside autograd `select` picks what the grid's
rule picks, without filling the K x K grid."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dcoco.models.heads.grid_parts as grid_parts
from dcoco.data.bigram import successor_log_probs
from dcoco.data.distill import Sample
from dcoco.models.heads.candidate_features import top_candidates
from dcoco.models.heads.selection import SELECTION_RULES, WALKS, selected_token_ids
from tests.test_corrector_options import OPTIONS, TOP_K, VOCAB, make_corrector, random_block

pytestmark = pytest.mark.usefixtures("one_thread")


def trained_looking(flags: dict, counts: bool, dtype) -> nn.Module:
    """A corrector with every zero-initialised output made non-zero (and pair counts if asked),
    so each term of S moves the scores."""
    extra = {}
    if counts:
        replies = [Sample("a", (1,), (5, 6, 7, 5, 6, 9)), Sample("b", (2,), (6, 7, 8, 5, 6))]
        table = successor_log_probs(replies, VOCAB)
        extra = dict(pair_counts=table[0].numel(), vocab_size=VOCAB)
    corrector = make_corrector(seed=4, randomise=True, **flags, **extra)
    if counts:
        corrector.pair_counts.fill(*table)
        with torch.no_grad():
            nn.init.normal_(corrector.bigram_scale)
    return corrector.to(dtype)


CASES = [(flags, counts) for flags in OPTIONS for counts in (False, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("flags,counts", CASES)
def test_each_row_the_walk_reads_equals_the_grids_row(flags, counts, dtype):
    corrector = trained_looking(flags, counts, dtype)
    hidden, logits, anchors = random_block(16, seed=5)
    hidden = hidden.to(dtype)
    with torch.no_grad():
        scores = corrector(hidden, logits, anchors)
        top = top_candidates(logits, TOP_K, normaliser=True)
        parts = corrector.grid_parts(hidden, *top, anchors)
        first = 0
        if flags["anchor"]:  # the anchor's pair: the walk reads its row 0, the start scores
            zeros = torch.zeros(16, dtype=torch.long)
            assert torch.equal(parts.row(corrector, 0, zeros), scores.start)
            first = 1
        for pair in range(scores.transitions.shape[1]):
            for candidate in range(TOP_K):
                index = torch.full((16,), candidate)
                row = parts.row(corrector, first + pair, index)
                assert torch.equal(row, scores.transitions[:, pair, candidate])


@pytest.mark.parametrize("selection", ["greedy", "keep1", "greedy/2"])
@pytest.mark.parametrize("flags,counts", CASES)
def test_select_walks_rows_and_picks_what_the_grid_picks(flags, counts, selection, monkeypatch):
    corrector = trained_looking(flags, counts, torch.float32)
    hidden, logits, anchors = random_block(32, seed=6)
    rule, _, count = selection.partition("/")
    with torch.no_grad():
        scores = corrector(hidden, logits, anchors, int(count) if count else None)
        expected = selected_token_ids(scores, SELECTION_RULES[rule](scores))

        def no_grid(*args, **kwargs):
            raise AssertionError("the walk filled the K x K grid")

        monkeypatch.setattr(grid_parts, "delta_grid", no_grid)
        monkeypatch.setattr(grid_parts, "WALK_MIN_CELLS", 1)  # walk whatever the size
        monkeypatch.setattr(grid_parts, "WALK_MIN_K", 1)
        assert rule in WALKS
        assert torch.equal(corrector.select(hidden, logits, anchors, selection), expected)


def test_the_path_rules_small_grids_and_training_fill_the_grid(monkeypatch):
    corrector = trained_looking(OPTIONS[-1], True, torch.float32)
    hidden, logits, anchors = random_block(4, seed=7)  # 4 x 5 pairs x 4 x 4 = 320 transitions
    calls = []
    full = grid_parts.delta_grid
    monkeypatch.setattr(grid_parts, "delta_grid", lambda *a: calls.append(1) or full(*a))
    monkeypatch.setattr(grid_parts, "WALK_MIN_CELLS", 321)
    with torch.no_grad():
        corrector.select(hidden, logits, anchors, "global")
        corrector.select(hidden, logits, anchors, "greedy")  # the grid is cheaper here
    monkeypatch.setattr(grid_parts, "WALK_MIN_CELLS", 320)
    corrector.select(hidden, logits, anchors, "greedy")  # autograd on: the training form
    assert len(calls) == 3
    with torch.no_grad():
        corrector.select(hidden, logits, anchors, "greedy")  # now it walks
    assert len(calls) == 3


def test_from_walk_min_k_candidates_even_one_small_block_walks(monkeypatch):
    corrector = trained_looking(OPTIONS[-1], True, torch.float32)
    hidden, logits, anchors = random_block(1, seed=8)  # 1 x 5 pairs x K x K: far below the cells
    calls = []
    full = grid_parts.delta_grid
    monkeypatch.setattr(grid_parts, "delta_grid", lambda *a: calls.append(1) or full(*a))
    monkeypatch.setattr(grid_parts, "WALK_MIN_K", TOP_K)
    with torch.no_grad():
        corrector.select(hidden, logits, anchors, f"greedy/{TOP_K - 1}")
        assert len(calls) == 1  # below WALK_MIN_K candidates: the grid
        corrector.select(hidden, logits, anchors, f"greedy/{TOP_K}")
        assert len(calls) == 1  # from WALK_MIN_K on: the walk
