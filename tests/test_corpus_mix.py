"""A second corpus mixed into training (dcoco.train.corpus_mix): its share, the held-out prompts
it may not answer, ids it may not reuse, and its features cached beside the main corpus's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_drafter_train import cyclic_corpus, tiny_config

from dcoco.data.distill import Sample, split_heldout
from dcoco.errors import DcocoError
from dcoco.train.corpus_mix import mix_in
from dcoco.train.drafter_train import train
from dcoco.train.feature_cache import shard_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def write_corpus(samples: list[Sample], directory):
    directory.mkdir(parents=True)
    with (directory / "part-0000.jsonl").open("w") as out:
        for sample in samples:
            record = {"id": sample.id, "prompt_ids": list(sample.prompt_ids),
                      "response_ids": list(sample.response_ids)}  # fmt: skip
            out.write(json.dumps(record) + "\n")
    return directory


def renamed(samples: list[Sample], suffix: str) -> list[Sample]:
    return [replace(s, id=s.id + suffix) for s in samples]


def test_mix_keeps_its_share_and_never_answers_a_heldout_prompt(tmp_path):
    train_set, heldout = split_heldout(cyclic_corpus(24), 4)
    mixed = renamed(cyclic_corpus(24), ":t1")  # the same prompts, answered again
    config = tiny_config(tmp_path / "run", mix_corpus=str(write_corpus(mixed, tmp_path / "mix")))
    result = mix_in(config, train_set, heldout, block_size=4)
    from_mix = [s for s in result if s.id.endswith(":t1")]
    assert len(from_mix) == 20  # the 4 answering held-out prompts are dropped
    assert not {s.prompt_ids for s in from_mix} & {s.prompt_ids for s in heldout}
    assert len(result) == 40  # share 0.5: 20 of the 20 main records kept
    quarter = mix_in(replace(config, mix_share=0.8), train_set, heldout, block_size=4)
    assert len(quarter) == 25 and sum(s.id.endswith(":t1") for s in quarter) == 20

    clash = write_corpus(cyclic_corpus(3), tmp_path / "clash")  # ids s0..s2 again
    with pytest.raises(DcocoError, match="reuses 3 ids"):
        mix_in(replace(config, mix_corpus=str(clash)), train_set, heldout, block_size=4)
    with pytest.raises(DcocoError, match="--mix-share"):
        tiny_config(tmp_path / "run", mix_share=0.0)


def test_a_mixed_run_trains_on_both_corpora_from_the_feature_cache(tiny_llama_target, tmp_path):
    corpus = write_corpus(cyclic_corpus(16), tmp_path / "corpus")
    mix = write_corpus(renamed(cyclic_corpus(16), ":t1"), tmp_path / "mix")
    config = tiny_config(
        tmp_path / "run", corpus=str(corpus), mix_corpus=str(mix), max_steps=4,
        feature_cache=str(tmp_path / "features"),
    )  # fmt: skip
    result = train(config, target=tiny_llama_target, progress_bar=False)
    assert result["steps"] == 4
    shards = sorted(p.name for p in shard_dir(tmp_path / "features", tiny_llama_target,
                                              config.taps).glob("*.json"))  # fmt: skip
    assert len(shards) == 2  # one per corpus's part, keyed by its bytes
