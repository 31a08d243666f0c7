"""Reading the distillation corpus and splitting off a stable held-out set."""

from __future__ import annotations

import json

import pytest

from dcoco.data.distill import Sample, load_corpus, split_heldout
from dcoco.errors import DcocoError


def write_part(directory, name, records):
    lines = [json.dumps(r) for r in records]
    (directory / name).write_text("\n".join(lines) + "\n")


def record(i: int, prompt: int = 3, response: int = 5) -> dict:
    return {"id": f"r{i}", "prompt_ids": list(range(prompt)), "response_ids": [7] * response,
            "finish": "eos"}  # fmt: skip


def test_reads_every_part_in_order_and_caps(tmp_path):
    write_part(tmp_path, "part-0001.jsonl", [record(2), record(3)])
    write_part(tmp_path, "part-0000.jsonl", [record(0), record(1, prompt=9)])
    (tmp_path / "README.md").write_text("not a part")
    samples = load_corpus(tmp_path)
    assert [s.id for s in samples] == ["r0", "r1", "r2", "r3"]
    assert samples[0].input_ids == [0, 1, 2, 7, 7, 7, 7, 7]
    assert len(load_corpus(tmp_path, max_records=3)) == 3
    cut = load_corpus(tmp_path, max_tokens=6)  # r1's prompt alone fills 6 tokens: dropped
    assert [s.id for s in cut] == ["r0", "r2", "r3"] and cut[0].num_tokens == 6


def test_bad_corpus_raises_clear_errors(tmp_path):
    with pytest.raises(DcocoError, match="does not exist"):
        load_corpus(tmp_path / "missing")
    with pytest.raises(DcocoError, match="no part"):
        load_corpus(tmp_path)
    (tmp_path / "part-0000.jsonl").write_text('{"id": "x", "prompt_ids": [1]}\n')
    with pytest.raises(DcocoError, match="part-0000.jsonl:1"):
        load_corpus(tmp_path)


def test_heldout_split_is_deterministic_and_stable_as_the_corpus_grows():
    samples = [Sample(f"r{i}", (1,), (2,)) for i in range(50)]
    train, heldout = split_heldout(samples, 5)
    assert len(train) == 45 and len(heldout) == 5
    assert not {s.id for s in train} & {s.id for s in heldout}
    grown = samples + [Sample(f"new{i}", (1,), (2,)) for i in range(5)]
    _, heldout_grown = split_heldout(grown, 5)
    assert len({s.id for s in heldout} & {s.id for s in heldout_grown}) >= 3
