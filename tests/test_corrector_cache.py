"""The corrector cache and drop-in training from it, on a tiny target: cached blocks equal an online
drafter pass, a torn shard is rebuilt, a killed run resumes to the same weights, and a corrector
trained from the cache corrects its frozen drafter."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_RUN
from test_head_train import SHARED, two_mode_corpus

from dcoco.decode.engine import Engine
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.models.drafter.drafter_io import WEIGHTS_FILE, load_drafter
from dcoco.train.block_pass import AnchorRule, prepare_item
from dcoco.train.corrector_cache import (
    CacheSpec,
    block_outputs,
    build_corrector_cache,
    weights_digest,
)
from dcoco.train.drafter_train import DrafterTrainConfig
from dcoco.train.drafter_train import train as train_drafter
from dcoco.train.head_train import HeadTrainConfig
from dcoco.train.head_train import train as train_head
from dcoco.train.run_dir import RunDir
from dcoco.train.target_features import TargetFeatures

pytestmark = pytest.mark.usefixtures("one_thread")


def write_corpus(samples, directory, parts: int = 2):
    directory.mkdir(parents=True)
    for part in range(parts):
        with (directory / f"part-{part:04d}.jsonl").open("w") as out:
            for sample in samples[part::parts]:
                record = {"id": sample.id, "prompt_ids": list(sample.prompt_ids),
                          "response_ids": list(sample.response_ids)}  # fmt: skip
                out.write(json.dumps(record) + "\n")
    return directory


@pytest.fixture
def trained_drafter(tiny_llama_target, tmp_path):
    samples = two_mode_corpus(24)
    result = train_drafter(
        DrafterTrainConfig(out=str(tmp_path / "drafter"), max_steps=40, **SHARED),
        target=tiny_llama_target, samples=samples, progress_bar=False,
    )  # fmt: skip
    return result["drafter"], write_corpus(samples, tmp_path / "corpus")


def test_cached_blocks_equal_an_online_pass_and_a_torn_shard_is_rebuilt(
    tiny_llama_target, trained_drafter, tmp_path, capsys
):
    path, corpus = trained_drafter
    target = tiny_llama_target
    drafter = load_drafter(path, target)
    spec = CacheSpec(weights_digest(tmp_path / "drafter" / "drafter" / WEIGHTS_FILE), 3, 6, 4)
    root = tmp_path / "cache"
    train, heldout = build_corrector_cache(drafter, target, corpus, root, spec, False)
    assert len(train) == 2 and heldout["anchor_ids"].shape[0] > 0
    first = (corpus / "part-0000.jsonl").read_text().splitlines()[0]
    sample = next(s for s in two_mode_corpus(24) if s.id == json.loads(first)["id"])
    item = prepare_item(sample, TargetFeatures(target, drafter.config.target_layer_ids),
                        AnchorRule(0, 3, 0), 4, None, 0, target.device)  # fmt: skip
    online = block_outputs(drafter, item, 6)
    blocks = online["anchor_ids"].shape[0]
    for name, value in online.items():  # the part's first record comes first in its shard
        cached = train[0][name][:blocks]
        if value.is_floating_point():
            torch.testing.assert_close(cached.float(), value.float(), rtol=1e-3, atol=1e-3)
        else:
            assert torch.equal(cached, value), name
    expected = train[0]["candidate_ids"].clone()
    del train  # its shards are memory-mapped: truncating a mapped file would fault
    shard = next(root.glob("part-0000-*.pt"))
    shard.write_bytes(shard.read_bytes()[:100])  # a torn write
    again, _ = build_corrector_cache(drafter, target, corpus, root, spec, False)
    assert "corrupt or stale; rebuilding" in capsys.readouterr().err
    assert torch.equal(again[0]["candidate_ids"], expected)


def cached_config(out, init, corpus, **flags) -> HeadTrainConfig:
    settings = dict(
        out=str(out), init=init, corpus=str(corpus), mode="dropin", corrector_cache=True,
        cache_stride=2, blocks_per_step=32, top_k=4, mlp_hidden=16, lr=3e-2, heldout=4,
        eval_every=1000, save_every=3, loss="conditional", features="normalised", anchor=True,
        successor_query=True, **{**TINY_RUN, "gamma": 4.0},
    )  # fmt: skip
    return HeadTrainConfig(**{**settings, **flags})


class Killed(Exception):
    pass


def test_a_killed_cached_run_resumes_to_the_same_weights(
    tiny_llama_target, trained_drafter, tmp_path, monkeypatch
):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    path, corpus = trained_drafter
    train_head(cached_config(tmp_path / "straight", path, corpus, max_steps=7),
               target=tiny_llama_target, progress_bar=False)  # fmt: skip
    log = RunDir.log

    def dies_after_step_5(self, record):  # between checkpoints (every 3 steps)
        log(self, record)
        if record.get("event") == "train" and record["step"] == 5:
            raise Killed

    killed = cached_config(tmp_path / "killed", path, corpus, max_steps=7)
    with monkeypatch.context() as patch:
        patch.setattr(RunDir, "log", dies_after_step_5)
        with pytest.raises(Killed):
            train_head(killed, target=tiny_llama_target, progress_bar=False)
    state = torch.load(tmp_path / "killed" / "ckpt" / "state.pt", weights_only=True)
    assert state["step"] == 3  # steps 4 and 5 are lost and redone
    train_head(killed, target=tiny_llama_target, progress_bar=False)
    a = torch.load(tmp_path / "straight" / "ckpt" / "state.pt", weights_only=True)["head"]
    b = torch.load(tmp_path / "killed" / "ckpt" / "state.pt", weights_only=True)["head"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_corrector_trained_from_the_cache_corrects_its_frozen_drafter(
    tiny_llama_target, trained_drafter, tmp_path, monkeypatch
):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    path, corpus = trained_drafter
    config = cached_config(
        tmp_path / "dcoco", path, corpus, max_steps=120, save_every=120, anchor=False
    )
    result = train_head(config, target=tiny_llama_target, progress_bar=False)
    final = result["final"]
    assert final["drafter_accept"] == pytest.approx(result["initial"]["accept"])
    # After `10` the next token is a coin flip, the rest follows from it: given the right
    # predecessor the corrector picks the right successor far more often than the drafter.
    assert final["slot_acc"][1] > final["drafter_slot_acc"][1] + 0.05
    assert sum(final["fixed"]) > 2 * sum(final["broken"])
    assert final["accept"] >= final["drafter_accept"]
    proposer = build_proposer(f"dcoco@{result['drafter']}", tiny_llama_target, MethodOptions())
    prompt = [50, 60, 70, 10, 20, 21, 22, 10]
    plain = Engine(tiny_llama_target).generate(prompt, 30)
    assert Engine(tiny_llama_target, proposer).generate(prompt, 30).new_ids == plain.new_ids


def test_pair_counts_come_from_parts_the_corrector_does_not_train_on(trained_drafter, tmp_path):
    from dcoco.data.distill import load_corpus, read_part, split_heldout
    from dcoco.errors import DcocoError
    from dcoco.train.head_train import count_records

    path, corpus = trained_drafter
    config = cached_config(tmp_path / "x", path, corpus, count_pairs=True, cache_parts=1)
    counted = {s.id for s in count_records(config)}
    trained_on = {s.id for s in read_part(corpus / "part-0000.jsonl")}
    _, heldout = split_heldout(load_corpus(corpus), config.heldout)
    assert counted and not counted & trained_on and not counted & {s.id for s in heldout}
    with pytest.raises(DcocoError, match="--cache-parts"):
        cached_config(tmp_path / "y", path, corpus, count_pairs=True)
    with pytest.raises(DcocoError, match="leaves no corpus part"):
        count_records(cached_config(tmp_path / "z", path, corpus, count_pairs=True, cache_parts=2))


def test_a_joint_run_with_pair_counts_trains_only_on_its_parts(
    tiny_llama_target, trained_drafter, tmp_path, monkeypatch
):
    from dcoco.data.distill import load_corpus, read_part, split_heldout
    from dcoco.train import loop

    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    runs, real_setup = [], loop.setup

    def setup(*args, **kwargs):
        runs.append(real_setup(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(loop, "setup", setup)
    path, corpus = trained_drafter
    config = cached_config(tmp_path / "joint", path, corpus, mode="joint", corrector_cache=False,
                           count_pairs=True, cache_parts=1, max_steps=2, batch_size=2,
                           block_size=4, anchor_chunk=8, feature_cache="off")  # fmt: skip
    result = train_head(config, target=tiny_llama_target, progress_bar=False)
    assert result["steps"] == 2
    trained_on = {s.id for s in runs[0].train_set}
    part0 = {s.id for s in read_part(corpus / "part-0000.jsonl")}
    _, heldout = split_heldout(load_corpus(corpus), config.heldout)
    assert trained_on and trained_on <= part0
    # the held-out blocks are the ones a run over every part evaluates on
    held_ids = [list(s.prompt_ids) + list(s.response_ids) for s in heldout]
    assert held_ids == [item.ids.tolist() for item in runs[0].eval_items]
