"""The draft vocabulary: a draft over a subset of the head's rows is the full draft restricted to
those rows (logits, copy bonus, each head's selection), decoding stays lossless, and the shipped
ranking is read, checked and rebuilt by one command."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from dcoco.data.distill import Sample
from dcoco.data.draft_vocab_build import DraftVocabConfig, run
from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.engine import Engine
from dcoco.decode.head_proposer import HeadProposer
from dcoco.decode.methods import draft_vocab_ids
from dcoco.errors import DcocoError
from dcoco.models.drafter.copy_hints import NO_HINT
from dcoco.models.drafter.draft_vocab import (
    PROVENANCE_FILE,
    RANKING_FILE,
    head_rows,
    parse_draft_vocab,
    rank_tokens,
    read_ranking,
    write_ranking,
)
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.heads.base import select_draft
from dcoco.models.heads.corrector import Corrector, CorrectorConfig
from dcoco.models.heads.head_registry import build_head
from dcoco.models.target.packed_linear import PackedLinear, onednn_available
from dcoco.models.target.precision import Int8WeightLinear

TAPS = (0, 1, 3)
pytestmark = pytest.mark.usefixtures("one_thread")


def make_drafter(target, gate: bool = False) -> BlockDrafter:
    config = DrafterConfig.for_target(target, num_layers=1, block_size=6, mask_token_id=3,
                                      target_layer_ids=TAPS)  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    if gate:
        drafter.add_copy_gate()
        nn.init.normal_(drafter.copy_gate.weight, std=1.0)
        nn.init.constant_(drafter.copy_gate.bias, 2.0)
    return drafter


def vocab_ids(vocab: int, seed: int = 1) -> torch.Tensor:
    """Every other token, shuffled: the vocabulary sorts them."""
    order = torch.randperm(vocab // 2, generator=torch.Generator().manual_seed(seed))
    return torch.arange(0, vocab, 2)[order]


class RecordingProposer:
    """Passes proposals through, keeping every drafted token."""

    def __init__(self, proposer):
        self.proposer = proposer
        self.name, self.feature_layers = proposer.name, proposer.feature_layers
        self.drafts: list[int] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.proposer.start(prompt_ids)

    def propose(self, context):
        proposal = self.proposer.propose(context)
        self.drafts.extend(proposal.draft_tokens.flatten().tolist())
        return proposal


def draft_inputs(target, drafter):
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(5, 120, (1, 20), generator=generator)
    features = target.forward(ids, target.new_cache(), feature_layers=TAPS).features
    hints = torch.full((1, 5), NO_HINT)
    hints[0, :3] = torch.tensor([7, 8, 9])  # one hint in the vocabulary (8), two outside
    return ids[:, -1], features[:, :-1], hints


def test_a_draft_vocab_keeps_the_full_drafts_columns_and_copy_bonus(tiny_llama_target):
    target = tiny_llama_target
    drafter = make_drafter(target, gate=True)
    anchor, features, hints = draft_inputs(target, drafter)
    full, hidden = drafter.draft(anchor, features, drafter.new_cache(), hint_ids=hints)
    kept = vocab_ids(target.info.vocab_size)
    drafter.use_draft_vocab(kept)
    sub, sub_hidden = drafter.draft(anchor, features, drafter.new_cache(), hint_ids=hints)
    columns = kept.sort().values
    assert sub.shape[-1] == len(kept) and torch.equal(sub_hidden, hidden)
    torch.testing.assert_close(sub, full[..., columns])  # the hint 8 got its bonus here too
    assert drafter.token_ids(sub.argmax(-1)).tolist() == columns[sub.argmax(-1)].tolist()
    drafter.use_draft_vocab(None)
    again, _ = drafter.draft(anchor, features, drafter.new_cache(), hint_ids=hints)
    assert torch.equal(again, full)
    assert not any("vocab" in name for name in drafter.state_dict())


@pytest.mark.parametrize("kind", ["linear", "packed", "int8"])
def test_head_rows_reads_any_head_back(kind):
    torch.manual_seed(0)
    linear = nn.Linear(32, 50, bias=False)
    ids = torch.tensor([3, 17, 49])
    if kind == "packed" and not onednn_available(torch.float32):
        pytest.skip("no oneDNN in this torch build")
    if kind == "linear":
        assert torch.equal(head_rows(linear, ids, 32, torch.float32), linear.weight[ids])
    elif kind == "packed":
        rows = head_rows(PackedLinear(linear), ids, 32, torch.float32)
        torch.testing.assert_close(rows, linear.weight[ids].detach())
    else:
        head = Int8WeightLinear(linear)
        expected = (head.weight_int8.float() * head.scale.float()[:, None])[ids]
        rows = head_rows(head, ids, 32, torch.bfloat16).float()
        torch.testing.assert_close(rows, expected, rtol=1e-2, atol=1e-3)


def test_drafters_with_a_draft_vocab_stay_lossless_and_draft_inside_it(tiny_target):
    drafter = make_drafter(tiny_target)
    kept = set(vocab_ids(tiny_target.info.vocab_size).tolist())
    drafter.use_draft_vocab(torch.tensor(sorted(kept)))
    corrector = Corrector(CorrectorConfig(drafter.config.hidden_size, top_k=8, mlp_hidden=16),
                          tiny_target.embed_tokens)  # fmt: skip
    prompt = torch.randint(5, 120, (8,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = Engine(tiny_target).generate(prompt, 24)
    for proposer in (DFlashProposer(drafter), HeadProposer(drafter, corrector)):
        recording = RecordingProposer(proposer)
        assert Engine(tiny_target, recording).generate(prompt, 24).new_ids == plain.new_ids
        assert recording.drafts and set(recording.drafts) <= kept
    drafter.use_draft_vocab(torch.tensor([5, 9, 30]))  # fewer rows than the corrector's top-k
    with pytest.raises(DcocoError, match="pass a larger --draft-vocab"):
        HeadProposer(drafter, corrector)


@pytest.mark.parametrize("kind", ["dcoco", "dspark", "domino"])
def test_each_head_selects_over_columns_as_over_masked_full_logits(kind):
    vocab, hidden_size = 40, 12
    torch.manual_seed(0)
    embed = nn.Embedding(vocab, hidden_size)
    fields = {"dcoco": dict(top_k=6, mlp_hidden=8), "dspark": dict(rank=4),
              "domino": dict(state_size=6, mlp_hidden=8)}[kind]  # fmt: skip
    head = build_head(kind, dict(hidden_size=hidden_size, vocab_size=vocab, **fields), embed)
    with torch.no_grad():
        for param in head.parameters():
            nn.init.normal_(param, std=0.5)
    hidden, logits = torch.randn(2, 4, hidden_size), torch.randn(2, 4, vocab) * 3
    anchor_ids = torch.tensor([1, 2])
    columns = torch.tensor([0, 3, 4, 9, 10, 11, 20, 21, 30, 39])
    masked = torch.full_like(logits, float("-inf"))
    masked[..., columns] = logits[..., columns]
    expected = select_draft(head, hidden, masked, anchor_ids, None)
    got = select_draft(head, hidden, logits[..., columns], anchor_ids, None, columns)
    assert torch.equal(got, expected)
    assert set(got.flatten().tolist()) <= set(columns.tolist())


def test_the_ranking_round_trips_and_bad_ones_fail_clearly(tmp_path):
    ranked, counts = rank_tokens([(5, 5, 7, 2), (7, 9, 5)])
    assert ranked.tolist() == [5, 7, 2, 9] and counts.tolist() == [3, 2, 1, 1]  # ties by id
    write_ranking(tmp_path, ranked, counts, {"made": "test"})
    assert read_ranking(tmp_path, 10).tolist() == [5, 7, 2, 9]
    assert json.loads((tmp_path / PROVENANCE_FILE).read_text())["ranking_digest"]
    with pytest.raises(DcocoError, match="does not rank this target"):
        read_ranking(tmp_path, 8)
    (tmp_path / RANKING_FILE).write_bytes(b"not safetensors")
    with pytest.raises(DcocoError, match="not a draft vocabulary"):
        read_ranking(tmp_path, 10)
    with pytest.raises(DcocoError, match="dcoco draft-vocab"):
        read_ranking(tmp_path / "missing", 10)
    for bad in ("0", "-3", "most", ""):
        with pytest.raises(DcocoError, match="draft-vocab must be"):
            parse_draft_vocab(bad)
    assert parse_draft_vocab("full") is None and parse_draft_vocab("12") == 12


def test_the_build_command_and_the_flag_resolve_the_shipped_ranking(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = [Sample(f"r{i}", (1, 2), (4, 4, 6, i % 3 + 10)) for i in range(30)]
    lines = [json.dumps({"id": s.id, "prompt_ids": s.prompt_ids, "response_ids": s.response_ids})
             for s in records]  # fmt: skip
    (corpus / "part-0000.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("DCOCO_CHECKPOINTS", str(tmp_path / "ckpt"))
    assert draft_vocab_ids("auto", "tiny", 128) is None  # no ranking shipped: every row
    with pytest.raises(DcocoError, match="dcoco draft-vocab"):
        draft_vocab_ids("2", "tiny", 128)
    assert run(DraftVocabConfig(target="tiny", corpus=str(corpus))) == 0
    provenance = json.loads((tmp_path / "ckpt" / "tiny" / PROVENANCE_FILE).read_text())
    assert provenance["records"] == 30 and provenance["parts"]["part-0000.jsonl"]
    assert provenance["heldout_coverage"]["2048"] == 1.0
    assert draft_vocab_ids("2", "tiny", 128).tolist() == [4, 6]
    assert draft_vocab_ids("auto", "tiny", 128) is None  # auto's 16000 rows cover this vocab
    assert len(draft_vocab_ids("auto", "tiny", 40_000)) == 5  # every ranked token (< auto's)
    assert draft_vocab_ids("full", "tiny", 40_000) is None
    assert draft_vocab_ids("40000", "tiny", 40_000) is None
