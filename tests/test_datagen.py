"""`dcoco datagen` on a tiny target: the target's own greedy replies, batched and resumable."""

from __future__ import annotations

import json

from conftest import CharTokenizer, make_tiny_target

from dcoco.data.datagen import DatagenConfig, generate_corpus, read_prompts
from dcoco.data.distill import load_corpus
from dcoco.decode.reference import reference_greedy


def test_datagen_matches_greedy_and_resumes(tmp_path):
    target = make_tiny_target("llama")
    target.tokenizer = CharTokenizer()
    rows = [{"id": f"p{i}", "turns": ["ab" * (i + 1)], "category": "chat"} for i in range(5)]
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prompts = read_prompts(str(prompts_file))
    config = DatagenConfig(
        out=str(tmp_path / "corpus"), batch_size=2, max_new_tokens=12, limit=3, chat=False
    )

    assert generate_corpus(target, prompts, config) == 3
    assert generate_corpus(target, prompts, config) == 2  # resumes: only the two left
    assert generate_corpus(target, prompts, config) == 0

    samples = load_corpus(tmp_path / "corpus")
    assert sorted(s.id for s in samples) == [f"p{i}" for i in range(5)]
    for sample in samples:  # left-padded batches reproduce batch-1 greedy decoding (fp32)
        expected = reference_greedy(target, list(sample.prompt_ids), 12)
        assert list(sample.response_ids) == expected
