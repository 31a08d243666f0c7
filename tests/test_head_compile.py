"""A draft head's compiled pick (dcoco.models.heads.head_compile): the eager picks in fp32 at every
batch size and slot count after one warm-up, no recompiling past it, the eager call where
compiling fails, and our engine's `dcoco` drafting with it as with the eager call."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from dcoco.decode.engine import Engine
from dcoco.decode.head_proposer import HeadProposer
from dcoco.models.cpu import cpu_kernels
from dcoco.models.heads import head_compile
from dcoco.models.heads.base import select_draft
from dcoco.models.heads.corrector import Corrector, CorrectorConfig
from dcoco.models.heads.fused_walk import fused_walk_for
from dcoco.models.heads.head_compile import HeadSelect
from tests.test_corrector_options import make_corrector, random_block
from tests.test_draft_vocab import RecordingProposer, make_drafter, vocab_ids

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_SLOTS = 3


def _corrector(seed: int = 2):
    # every term of the shipped corrector: normalised features, successor query, anchor
    flags = dict(features="normalised", successor_query=True, anchor=True)
    return make_corrector(seed=seed, randomise=True, **flags).eval()


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


def test_a_server_head_answers_eagerly_then_walks_fused_and_never_traces(monkeypatch):
    # a server's head on a CPU: the first call starts the thread and is answered at once by the
    # eager pick; once the thread has built the kernels, calls walk fused. Nothing is compiled:
    # tracing beside vLLM's model steps broke one (soak, 2026-12-08). The thread waits at a gate
    # until the first call has been answered, so the test sees both phases.
    if cpu_kernels.kernels() is None:
        pytest.skip("the fused CPU kernels do not build here")
    gate = threading.Event()
    monkeypatch.setattr(head_compile, "_lowest_priority", lambda: gate.wait(timeout=60))

    def no_tracing(*args, **kwargs):
        raise AssertionError("a server's head compiled on a CPU")

    monkeypatch.setattr(torch, "compile", no_tracing)
    corrector = _corrector()
    select = HeadSelect(corrector, None, None, MAX_SLOTS, in_background=True, fused=True)
    with torch.inference_mode():
        hidden, logits, anchors = random_block(5, seed=3)
        first = select(hidden[:, :2], logits[:, :2], anchors)
        assert not select.fused and not select.wait(timeout=0)  # eager, the thread waits
        assert torch.equal(
            first, select_draft(corrector, hidden[:, :2], logits[:, :2], anchors, None)
        )
        gate.set()
        assert select.wait(timeout=900) and select.fused and not select.compiled
        assert all(table._frozen for table in corrector._tables())  # built in the thread
        for batch, slots in ((1, 1), (7, 3), (2, 2)):
            hidden, logits, anchors = random_block(batch, seed=batch + slots)
            picks = select(hidden[:, :slots], logits[:, :slots], anchors)
            eager = select_draft(corrector, hidden[:, :slots], logits[:, :slots], anchors, None)
            assert torch.equal(picks, eager), (batch, slots)
    unfused = HeadSelect(_corrector(), None, None, MAX_SLOTS, in_background=True)
    with torch.inference_mode():
        hidden, logits, anchors = random_block(2, seed=5)
        unfused(hidden, logits, anchors)  # a CPU server without the fused walk: eager, at once
    assert unfused.wait(timeout=0) and not unfused.fused and not unfused.compiled


def test_compiled_heads_in_one_process_all_stay_compiled(caplog):
    # one code object for both: past dynamo's cap (8 graphs) it would run them eagerly; the
    # second head has the first's structure and other weights (a graph reused reads its own)
    heads = [_corrector(), _corrector(seed=4), make_corrector(seed=5, randomise=True)]
    selects = [HeadSelect(head, None, None, MAX_SLOTS) for head in heads]
    with torch.inference_mode(), caplog.at_level("WARNING"):
        for round_ in range(2):
            for head, select in zip(heads, selects, strict=True):
                hidden, logits, anchors = random_block(3, seed=round_)
                picks = select(hidden, logits, anchors)
                assert torch.equal(picks, select_draft(head, hidden, logits, anchors, None))
    assert "recompile_limit" not in caplog.text and all(s.compiled for s in selects)


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


def _engine_corrector(target) -> tuple:
    """A drafter over a draft vocabulary and a corrector whose every term moves its scores."""
    drafter = make_drafter(target)
    drafter.use_draft_vocab(vocab_ids(target.info.vocab_size))
    config = CorrectorConfig(drafter.config.hidden_size, top_k=4, mlp_hidden=16,
                             features="normalised", successor_query=True, anchor=True)  # fmt: skip
    torch.manual_seed(5)
    corrector = Corrector(config, target.embed_tokens).eval()
    with torch.no_grad():  # zero-initialised output layers would keep the drafter's top-1
        for name, parameter in corrector.named_parameters():
            if name.startswith(("delta_out", "query_out")):
                torch.nn.init.normal_(parameter)
    return drafter, corrector


def _engine_drafts(target, proposer, prompt: list[int]) -> list:
    """The drafts `proposer` made while the engine decoded `prompt` as plain decoding does."""
    recording = RecordingProposer(proposer)
    plain = Engine(target).generate(prompt, 20).new_ids
    assert Engine(target, recording).generate(prompt, 20).new_ids == plain
    assert recording.drafts
    return recording.drafts


PROMPT = torch.randint(5, 120, (8,), generator=torch.Generator().manual_seed(2)).tolist()


def test_the_engine_drafts_with_the_compiled_pick_as_with_the_eager_one(tiny_llama_target):
    drafter, corrector = _engine_corrector(tiny_llama_target)
    runs = []
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for compile_head in (False, True):
        proposer = HeadProposer(drafter, corrector, num_draft_tokens=3, compile_head=compile_head,
                                fused_walk=False)  # fmt: skip
        runs.append(_engine_drafts(tiny_llama_target, proposer, PROMPT))
        assert proposer.select.compiled == compile_head
    assert runs[0] == runs[1]
    # the warm-up's graph for each of 1-3 slots, none after it: the drafter hands over its
    # first slots of a longer block, a view whose strides the warm-up's inputs do not have
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 3


def test_the_engine_drafts_with_the_fused_walk_as_with_the_eager_pick(tiny_llama_target):
    if fused_walk_for(_corrector(), None, None) is None:
        pytest.skip("the fused CPU kernels do not build here")
    drafter, corrector = _engine_corrector(tiny_llama_target)
    runs = []
    for fused in (False, True):
        proposer = HeadProposer(drafter, corrector, num_draft_tokens=3, fused_walk=fused)
        runs.append(_engine_drafts(tiny_llama_target, proposer, PROMPT))
        assert proposer.select.fused == fused
    assert runs[0] == runs[1]


def test_the_frozen_tables_count_as_set_up_not_as_a_drafts_cost(monkeypatch):
    corrector = _corrector()
    select = HeadSelect(corrector, None, None, MAX_SLOTS)
    prepare = corrector.prepare_inference

    def slow_prepare(*args, **kwargs):  # a large table built once, before the compile
        time.sleep(0.4)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(corrector, "prepare_inference", slow_prepare)
    with torch.inference_mode():
        hidden, logits, anchors = random_block(1, seed=3)
        started = time.perf_counter()
        select(hidden[:, :2], logits[:, :2], anchors)
        first_call = time.perf_counter() - started
    assert select.compiled and select.setup_s >= 0.4
    assert first_call - select.setup_s < 0.2  # what a first draft is charged
