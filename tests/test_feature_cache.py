"""The feature cache: batched, memory-mapped taps equal the ones computed online; a corpus that
grows adds shards; a torn or corrupt shard is rebuilt; training reads it."""

from __future__ import annotations

import json

import pytest
import torch

from dcoco.data.distill import load_corpus
from dcoco.train.feature_cache import build_feature_cache, shard_dir
from dcoco.train.target_features import TargetFeatures

pytestmark = pytest.mark.usefixtures("one_thread")
TAPS = (0, 2, 3)


def write_part(directory, index: int, lengths: list[tuple[int, int]], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    lines = []
    for number, (prompt, response) in enumerate(lengths):
        ids = torch.randint(4, 128, (prompt + response,), generator=generator).tolist()
        record = {
            "id": f"p{index}-{number}",
            "prompt_ids": ids[:prompt],
            "response_ids": ids[prompt:],
        }
        lines.append(json.dumps(record))
    (directory / f"part-{index:04d}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def corpus(tmp_path):
    directory = tmp_path / "corpus"
    directory.mkdir()
    # Lengths differ, so batches are right-padded.
    write_part(directory, 0, [(5, 20), (9, 41), (3, 7)], seed=0)
    write_part(directory, 1, [(6, 33), (4, 12)], seed=1)
    return directory


def test_cached_features_equal_online_features(tiny_llama_target, corpus, tmp_path):
    cache = build_feature_cache(
        tiny_llama_target, TAPS, corpus, tmp_path / "cache", batch_tokens=64
    )
    online = TargetFeatures(tiny_llama_target, TAPS)
    samples = load_corpus(corpus)
    assert len(samples) == 5 and all(s in cache for s in samples)
    for sample in samples:
        cached = cache(sample)  # [1, tokens, taps * hidden]
        expected = online(sample)
        assert cached.shape == expected.shape == (1, sample.num_tokens, len(TAPS) * 64)
        # Stored in bf16: equal to the online features rounded the same way.
        torch.testing.assert_close(
            cached, expected.to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2
        )
    # A record cut shorter (--max-seq-len) reads a prefix of its rows.
    cut = load_corpus(corpus, max_tokens=10)[1]
    torch.testing.assert_close(cache(cut), cache(samples[1])[:, :10])


def test_growing_corpus_adds_shards_and_corrupt_shards_are_rebuilt(
    tiny_llama_target, corpus, tmp_path, capsys
):
    root = tmp_path / "cache"
    build_feature_cache(tiny_llama_target, TAPS, corpus, root, progress_bar=False)
    shards = shard_dir(root, tiny_llama_target, TAPS)
    first = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.bin")}
    assert len(first) == 2
    write_part(corpus, 2, [(4, 16)], seed=2)
    capsys.readouterr()
    cache = build_feature_cache(tiny_llama_target, TAPS, corpus, root, progress_bar=False)
    assert "1 corpus parts" in capsys.readouterr().err  # only the new part was computed
    assert {p.name: p.stat().st_mtime_ns for p in shards.glob("*.bin") if p.name in first} == first
    assert len(cache.shards) == 6
    # A truncated shard (a disk problem, a torn copy) is reported and rebuilt, not read.
    victim = next(shards.glob("part-0000-*.bin"))
    victim.write_bytes(victim.read_bytes()[:100])
    cache = build_feature_cache(tiny_llama_target, TAPS, corpus, root, progress_bar=False)
    assert "corrupt or stale" in capsys.readouterr().err
    sample = load_corpus(corpus)[0]
    expected = TargetFeatures(tiny_llama_target, TAPS)(sample).to(torch.bfloat16).float()
    torch.testing.assert_close(cache(sample), expected, atol=1e-2, rtol=1e-2)


def test_only_the_parts_of_the_needed_records_are_built(tiny_llama_target, corpus, tmp_path):
    root = tmp_path / "cache"
    cache = build_feature_cache(
        tiny_llama_target, TAPS, corpus, root, progress_bar=False, needed={"p1-0"}
    )
    assert sorted(cache.shards) == ["p1-0", "p1-1"]
    assert [p.name[:9] for p in shard_dir(root, tiny_llama_target, TAPS).glob("*.bin")] == [
        "part-0001"
    ]


def test_cache_parts_caches_the_trained_parts_and_reads_the_rest_online(
    tiny_llama_target, corpus, tmp_path
):
    from types import SimpleNamespace

    from dcoco.train.feature_cache import open_features

    config = SimpleNamespace(
        feature_cache=str(tmp_path / "cache"), max_records=0, cache_parts=1, corpus=str(corpus)
    )
    samples = load_corpus(corpus)
    cache = open_features(config, tiny_llama_target, TAPS, samples)
    assert sorted(cache.shards) == ["p0-0", "p0-1", "p0-2"]  # part 1 is not built
    assert [
        p.name[:9] for p in shard_dir(tmp_path / "cache", tiny_llama_target, TAPS).glob("*.bin")
    ] == ["part-0000"]
    later = next(s for s in samples if s.id == "p1-0")
    torch.testing.assert_close(cache(later), TargetFeatures(tiny_llama_target, TAPS)(later))


def test_a_cache_the_disk_cannot_hold_is_refused_before_anything_is_written(
    tiny_llama_target, corpus, tmp_path, monkeypatch
):
    import shutil
    from collections import namedtuple

    from dcoco.errors import DcocoError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(DcocoError, match="the feature cache needs .* GiB .* --feature-cache off"):
        build_feature_cache(tiny_llama_target, TAPS, corpus, tmp_path / "cache", progress_bar=False)
    assert not list((tmp_path / "cache").rglob("*.bin"))
