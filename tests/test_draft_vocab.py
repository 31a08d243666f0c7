"""A drafter's draft vocabulary (dcoco.models.draft_vocab, `dcoco draft-vocab`): only its rows
are scored, every other token is -inf, decoding stays lossless, bad files are one clear error."""

from __future__ import annotations

import json

import pytest
import torch

from dcoco.data.distill import load_corpus, split_heldout
from dcoco.decode.engine import Engine
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.errors import DcocoError
from dcoco.models.draft_vocab import (
    DRAFT_VOCAB_FILE,
    VocabHead,
    read_draft_vocab,
    read_metadata,
    save_draft_vocab,
)
from dcoco.models.drafter import BlockDrafter, DrafterConfig
from dcoco.models.drafter_io import save_drafter
from dcoco.train.draft_vocab_build import DraftVocabConfig, build

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def drafter_dir(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    config = DrafterConfig.for_target(
        target, block_size=4, mask_token_id=3, target_layer_ids=(0, 1)
    )
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head).eval()
    return save_drafter(tmp_path / "drafter", drafter, target.info, dtype=torch.float32)


def test_vocab_head_scores_its_rows_and_nothing_else():
    head = torch.nn.Linear(8, 20, bias=True)
    ids = torch.tensor([1, 4, 5, 17])
    rows = torch.randn(3, 8)
    got = VocabHead(head, ids)(rows)
    full = head(rows)
    assert got.shape == (3, 20)
    assert torch.allclose(got[:, ids], full[:, ids])
    outside = torch.ones(20, dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(got[:, outside]).all()


def test_decoding_drafts_only_vocabulary_tokens_and_stays_lossless(tiny_llama_target, drafter_dir):
    target = tiny_llama_target
    ids = torch.arange(5, 60)
    save_draft_vocab(drafter_dir, ids, {"size": str(len(ids))})
    spec = f"dflash@{drafter_dir}"
    proposer = build_proposer(spec, target, MethodOptions())
    assert proposer.drafter.draft_head is not None
    assert build_proposer(spec, target, MethodOptions(draft_vocab=False)).drafter.draft_head is None
    prompt = torch.randint(5, 128, (10,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = Engine(target).generate(prompt, 24).new_ids
    assert Engine(target, proposer).generate(prompt, 24).new_ids == plain  # fp32: exact
    logits, _ = proposer.drafter.draft(
        torch.tensor([7]),
        torch.randn(1, 3, 2 * target.config.hidden_size),
        proposer.drafter.new_cache(),
    )
    assert set(logits.argmax(-1).flatten().tolist()) <= set(ids.tolist())


def test_bad_vocabulary_files_are_one_clear_error(drafter_dir):
    save_draft_vocab(drafter_dir, torch.tensor([1, 2, 500]), {})
    with pytest.raises(DcocoError, match="outside 0..127"):
        read_draft_vocab(drafter_dir, 128)
    (drafter_dir / DRAFT_VOCAB_FILE).write_bytes(b"not safetensors")
    with pytest.raises(DcocoError, match="unreadable"):
        read_draft_vocab(drafter_dir, 128)
    (drafter_dir / DRAFT_VOCAB_FILE).unlink()
    assert read_draft_vocab(drafter_dir, 128) is None


def test_build_counts_the_training_split_and_states_coverage(drafter_dir, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    generator = torch.Generator().manual_seed(3)
    with (corpus / "part-0000.jsonl").open("w") as part:
        for i in range(12):
            reply = torch.randint(5, 40, (30,), generator=generator).tolist()
            part.write(json.dumps({"id": f"r{i}", "prompt_ids": [1, 2], "response_ids": reply}))
            part.write("\n")
    config = DraftVocabConfig(drafter=str(drafter_dir), size=10, corpus=str(corpus), heldout=3)
    path, metadata = build(config)
    train, heldout = split_heldout(load_corpus(corpus), 3)
    counts: dict[int, int] = {}
    for sample in train:
        for token in sample.response_ids:
            counts[token] = counts.get(token, 0) + 1
    expected = sorted(sorted(counts, key=lambda t: (-counts[t], t))[:10])
    assert read_draft_vocab(drafter_dir, 128).tolist() == expected
    tokens = [t for s in heldout for t in s.response_ids]
    coverage = sum(t in expected for t in tokens) / len(tokens)
    assert float(read_metadata(drafter_dir)["heldout_token_coverage"]) == pytest.approx(
        coverage, abs=1e-5
    )
    assert metadata["corpus_records"] == "9" and path.name == DRAFT_VOCAB_FILE
    with pytest.raises(DcocoError, match="--size"):
        build(DraftVocabConfig(drafter=str(drafter_dir), size=0, corpus=str(corpus)))
