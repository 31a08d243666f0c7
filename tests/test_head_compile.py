"""The served head's compiled pick (dcoco.serving.head_compile): the eager picks in fp32 at every
batch size and slot count after one warm-up, no recompiling past it, and the eager call where
compiling fails."""

from __future__ import annotations

import pytest
import torch

from dcoco.models.heads import select_draft
from dcoco.serving.head_compile import HeadSelect
from tests.test_corrector_options import make_corrector, random_block

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_SLOTS = 3


def _corrector():
    # every term of the shipped corrector: normalised features, successor query, anchor
    flags = dict(features="normalised", successor_query=True, anchor=True)
    return make_corrector(seed=2, randomise=True, **flags).eval()


def test_compiled_picks_are_the_eager_ones_without_recompiling(monkeypatch):
    corrector = _corrector()
    select = HeadSelect(corrector, None, None, MAX_SLOTS)
    compiles = []
    original = torch.compile

    def counted(function, **options):
        compiles.append(options)
        return original(function, **options)

    monkeypatch.setattr(torch, "compile", counted)
    with torch.inference_mode():
        hidden, logits, anchors = random_block(5, seed=3)
        first = select(hidden[:, :2], logits[:, :2], anchors)  # warms up 1-3 slots, 1-2 rows
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        eager = select_draft(corrector, hidden[:, :2], logits[:, :2], anchors, None)
        assert torch.equal(first, eager)
        for batch, slots in ((1, 1), (7, 3), (2, 2), (4, 1)):
            hidden, logits, anchors = random_block(batch, seed=batch + slots)
            picks = select(hidden[:, :slots], logits[:, :slots], anchors)
            eager = select_draft(corrector, hidden[:, :slots], logits[:, :slots], anchors, None)
            assert torch.equal(picks, eager), (batch, slots)
        # every later size ran a graph of the warm-up
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert len(compiles) == 1 and select.compiled


def test_without_compiling_it_is_the_eager_call(monkeypatch):
    corrector = _corrector()
    monkeypatch.setattr(torch, "compile", None)  # never called
    select = HeadSelect(corrector, "keep1", None, MAX_SLOTS, compile=False)
    hidden, logits, anchors = random_block(3, seed=2)
    with torch.inference_mode():
        select.prepare(hidden, logits, anchors)
        eager = select_draft(corrector, hidden, logits, anchors, "keep1")
        assert torch.equal(select(hidden, logits, anchors), eager) and not select.compiled


def test_a_failed_compile_serves_the_eager_call(monkeypatch, capsys):
    corrector = _corrector()

    def broken(function, **options):
        def call(*args):
            raise RuntimeError("no C++ compiler\nmore detail")

        return call

    monkeypatch.setattr(torch, "compile", broken)
    select = HeadSelect(corrector, None, None, MAX_SLOTS)
    hidden, logits, anchors = random_block(3, seed=1)
    with torch.inference_mode():
        picks = select(hidden, logits, anchors)
        assert torch.equal(picks, select_draft(corrector, hidden, logits, anchors, None))
    assert "the draft head runs eagerly (RuntimeError: no C++ compiler)" in capsys.readouterr().err
    assert not select.compiled
