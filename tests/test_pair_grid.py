"""The corrector's inference path (dcoco.models.heads.pair_grid, dcoco.models.heads.vocab_table)
against its training form: the chunked grid gives the same bits, the tabled projections the same
scores up to rounding, and a table never outlives the weights it was made from."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dcoco.models.heads.candidate_features as candidates
import dcoco.models.heads.pair_grid as pair_grid
from dcoco.errors import DcocoError
from dcoco.models.heads.selection import check_selection
from dcoco.models.heads.vocab_table import VocabTable
from tests.test_corrector_options import counted_corrector, make_corrector, random_block

pytestmark = pytest.mark.usefixtures("one_thread")


def grid_inputs(batch: int, pairs: int, top_k: int, width: int, dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    out = nn.Linear(width, 1).to(dtype)
    with torch.no_grad():
        out.weight.copy_(draw(1, width))
        out.bias.copy_(draw(1))
    counted = -20 * torch.rand(batch, pairs, top_k, top_k, generator=generator)
    return (
        draw(batch, pairs, width),
        draw(batch, pairs, top_k, width),
        draw(batch, pairs, top_k, width),
        out,
        (counted.clamp(min=-30.0) / 10.0).to(dtype),
        draw(width),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_rows", [1, 3, 100])  # one pair, a ragged last chunk, one chunk
@pytest.mark.parametrize("counted", [False, True])
def test_the_chunked_grid_equals_the_broadcast_form_bit_for_bit(
    monkeypatch, dtype, chunk_rows, counted
):
    top_k, width = 4, 8
    monkeypatch.setattr(pair_grid, "CHUNK_NUMBERS", chunk_rows * top_k * top_k * width)
    pair, from_pre, to_pre, out, scaled, counted_in = grid_inputs(2, 5, top_k, width, dtype, 3)
    if not counted:
        scaled = counted_in = None
    scratch = pair_grid.GridScratch()
    with torch.enable_grad():
        broadcast = pair_grid.delta_grid(pair, from_pre, to_pre, out, scaled, counted_in)
    with torch.no_grad():
        chunked = pair_grid.delta_grid(pair, from_pre, to_pre, out, scaled, counted_in, scratch)
        again = pair_grid.delta_grid(pair, from_pre, to_pre, out, scaled, counted_in, scratch)
    assert broadcast.requires_grad and broadcast.dtype == chunked.dtype == torch.float32
    assert torch.equal(chunked, broadcast.detach())
    assert torch.equal(again, chunked)  # the reused buffer leaves nothing behind


def test_a_vocab_table_is_rebuilt_when_its_weights_change():
    torch.manual_seed(0)
    embedding, project = nn.Embedding(30, 6), nn.Linear(6, 4, bias=False)
    table = VocabTable(project)
    ids = torch.tensor([[3, 29], [0, 3]])
    with torch.no_grad():
        first = table.rows(ids, embedding.weight, (project.weight,), torch.float32)
        torch.testing.assert_close(first, project(embedding(ids)), rtol=0, atol=1e-6)
        project.weight.mul_(2.0)  # an in-place update, as an optimiser step makes
        second = table.rows(ids, embedding.weight, (project.weight,), torch.float32)
        torch.testing.assert_close(second, 2 * first, rtol=0, atol=1e-6)
        embedding.weight[3] = 0.0
        third = table.rows(ids, embedding.weight, (project.weight,), torch.float32)
    assert torch.equal(third[0, 0], torch.zeros(4)) and torch.equal(third[0, 1], second[0, 1])


@pytest.mark.parametrize("anchor", [False, True])
def test_inference_scores_equal_the_training_form(anchor):
    """Every option on (normalised features, successor term, pair counts): the scores with grad
    (training form) and without (chunked grid, tabled projections) agree to rounding, and the
    tables follow a weight update between two calls."""
    corrector = counted_corrector(True, features="normalised", successor_query=True, anchor=anchor)
    hidden, logits, anchors = random_block(3, seed=8)
    for _ in range(2):
        with torch.inference_mode():  # the engine's mode: its buffers are inference tensors
            engine = corrector(hidden, logits, anchors)
        with torch.no_grad():
            fast = corrector(hidden, logits, anchors)
        assert torch.equal(engine.transitions, fast.transitions)
        slow = corrector(hidden, logits, anchors)
        torch.testing.assert_close(fast.transitions, slow.transitions.detach(), rtol=0, atol=1e-5)
        if anchor:
            torch.testing.assert_close(fast.start, slow.start.detach(), rtol=0, atol=1e-5)
        with torch.no_grad():
            corrector.token_proj.weight.add_(0.5)
            corrector.query_out.weight.mul_(-3.0)


def test_an_untrained_corrector_builds_no_table_it_does_not_need():
    corrector = make_corrector(successor_query=False, use_candidate_repr=False)
    assert not hasattr(corrector, "_token_table") and not hasattr(corrector, "_successor_table")


def test_a_walk_over_fewer_candidates_reads_the_same_scores_for_them():
    """greedy/2 on a corrector trained on the top 4: the grid is the top-left 2 x 2 corner of the
    full one (same features, rank over the trained K), and the walk stays inside it."""
    corrector = make_corrector(randomise=True, features="normalised", successor_query=True)
    hidden, logits, anchors = random_block(3, seed=9)
    with torch.no_grad():
        full = corrector(hidden, logits, anchors)
        corner = corrector(hidden, logits, anchors, top_k=2)
        drafted = corrector.select(hidden, logits, anchors, selection="greedy/2")
    torch.testing.assert_close(corner.transitions, full.transitions[..., :2, :2], rtol=0, atol=1e-6)
    assert torch.isin(drafted, full.candidate_ids[..., :2]).all()
    with pytest.raises(DcocoError, match="trained on the top 4"):
        corrector.select(hidden, logits, anchors, selection="greedy/5")
    for bad in ("greedy/0", "greedy/x", "fast/2"):
        with pytest.raises(DcocoError, match="selection"):
            check_selection(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_candidates_in_chunks_equal_one_piece(monkeypatch, dtype):
    logits = (4 * torch.randn(3, 5, 300, generator=torch.Generator().manual_seed(4))).to(dtype)
    monkeypatch.setattr(candidates, "CHUNK_SLOTS", 4)  # 15 slots: 4 chunks, the last ragged
    values, ids, normaliser = candidates.top_candidates(logits, 6, normaliser=True)
    whole = logits.float()
    assert values.dtype == torch.float32 and ids.shape == (3, 5, 6)
    assert torch.equal(values, whole.topk(6, dim=-1).values)
    assert torch.equal(ids, whole.topk(6, dim=-1).indices)
    assert torch.equal(normaliser, whole.logsumexp(dim=-1))
    assert candidates.top_candidates(logits, 6, normaliser=False)[2] is None


def test_prepared_tables_are_not_built_again_by_the_first_draft():
    corrector = make_corrector(randomise=True, features="normalised", successor_query=True)
    builds = []
    for table in (corrector._token_table, corrector._successor_table):
        project = table._project
        table._project = lambda rows, project=project: builds.append(1) or project(rows)
    corrector.prepare_inference()
    built = len(builds)
    hidden, logits, anchors = random_block(2, seed=10)
    with torch.inference_mode():
        corrector.select(hidden, logits, anchors)
    assert built > 0 and len(builds) == built


def test_a_deferred_table_projects_the_rows_asked_for_without_building():
    # a served head's first steps, while another thread builds the tables (head_compile)
    corrector = make_corrector(randomise=True, features="normalised", successor_query=True)
    corrector.defer_tables()
    hidden, logits, anchors = random_block(2, seed=10)
    with torch.inference_mode():
        deferred = corrector.select(hidden, logits, anchors)
    assert all(table._table is None for table in corrector._tables())
    corrector.prepare_inference(frozen=True)
    with torch.inference_mode():
        assert torch.equal(corrector.select(hidden, logits, anchors), deferred)
