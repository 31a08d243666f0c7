"""`dcoco datagen` on a tiny target: the target's own greedy replies, batched and resumable."""

from __future__ import annotations

import json

import pytest
from conftest import CharTokenizer, make_tiny_target

from dcoco import paths
from dcoco.data.datagen import DatagenConfig, _vllm_python, generate_corpus, read_prompts, run
from dcoco.data.distill import load_corpus
from dcoco.decode.reference import reference_greedy
from dcoco.errors import DcocoError


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


def test_engine_choice_is_checked_and_auto_falls_back_to_hf(monkeypatch):
    def no_vllm(explicit=""):
        raise DcocoError("vLLM is not installed: run `make venv-vllm`")

    monkeypatch.setattr(paths, "find_vllm_python", no_vllm)
    assert _vllm_python("auto") is None and _vllm_python("hf") is None
    with pytest.raises(DcocoError, match="not installed"):
        _vllm_python("vllm")
    with pytest.raises(DcocoError, match="--engine must be"):
        run(DatagenConfig(prompts="unused.jsonl", engine="sglang"))


def test_sampled_replies_leave_greedy_and_repeat_with_their_seed(tmp_path):
    target = make_tiny_target("llama")
    target.tokenizer = CharTokenizer()
    rows = [{"id": f"p{i}", "turns": ["ab" * (i + 1)]} for i in range(4)]
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prompts = read_prompts(str(prompts_file))

    def replies(name: str, seed: int) -> dict[str, tuple[int, ...]]:
        config = DatagenConfig(
            out=str(tmp_path / name), batch_size=4, max_new_tokens=12, chat=False,
            temperature=1.0, seed=seed,
        )  # fmt: skip
        assert generate_corpus(target, prompts, config) == 4
        return {s.id: s.response_ids for s in load_corpus(tmp_path / name)}

    first, again, other = replies("a", 0), replies("b", 0), replies("c", 1)
    assert first == again  # the seed fixes the replies
    assert first != other
    greedy = {
        s.id: tuple(reference_greedy(target, list(s.prompt_ids), 12))
        for s in load_corpus(tmp_path / "a")
    }
    assert first != greedy  # a random tiny model's next-token distribution is far from one-hot
    with pytest.raises(DcocoError, match="--temperature"):
        run(DatagenConfig(prompts=str(prompts_file), temperature=-1.0))


def test_two_shards_merged_equal_one_run_token_for_token(tmp_path):
    from dcoco.data.shards import shard_of

    target = make_tiny_target("llama")  # fp32
    target.tokenizer = CharTokenizer()
    rows = [{"id": f"q{i}", "turns": ["ba" * (i % 4 + 1) + "a" * i]} for i in range(9)]
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prompts = read_prompts(str(prompts_file))
    shards = [shard_of(prompts, f"{i}/2") for i in range(2)]
    assert sorted(p["id"] for s in shards for p in s) == sorted(p["id"] for p in prompts)
    assert (
        shards[0] and shards[1] and not {p["id"] for p in shards[0]} & {p["id"] for p in shards[1]}
    )

    def config(out, shard="0/1"):
        return DatagenConfig(out=str(out), batch_size=3, max_new_tokens=10, chat=False, shard=shard)

    assert generate_corpus(target, prompts, config(tmp_path / "one")) == 9
    for index, shard in enumerate(shards):  # both write into one directory
        assert generate_corpus(target, shard, config(tmp_path / "two", f"{index}/2")) == len(shard)
    names = sorted(p.name for p in (tmp_path / "two").glob("part-*.jsonl"))
    assert names == ["part-0000of0002-0000.jsonl", "part-0001of0002-0000.jsonl"]
    one = {s.id: s for s in load_corpus(tmp_path / "one")}
    two = {s.id: s for s in load_corpus(tmp_path / "two")}
    assert one.keys() == two.keys()
    assert all(one[k].response_ids == two[k].response_ids for k in one)
    for bad in ("2/2", "1", "a/b", "0/0"):
        with pytest.raises(DcocoError, match="--shard must be I/N"):
            shard_of(prompts, bad)
