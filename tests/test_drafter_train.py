"""The drafter trainer end to end on a tiny target: it learns, it resumes exactly, it records."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import TINY_RUN

from dcoco import paths
from dcoco.config import config_from_args
from dcoco.data.distill import Sample
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.train import drafter_train, loop
from dcoco.train.drafter_train import DrafterTrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")


def cyclic_corpus(count: int = 24) -> list[Sample]:
    """Responses walk a fixed 10-token cycle from a random phase: learnable from the anchor."""
    generator = torch.Generator().manual_seed(0)
    cycle = list(range(20, 30))
    samples = []
    for i in range(count):
        phase = int(torch.randint(0, 10, (1,), generator=generator))
        prompt = torch.randint(40, 128, (6,), generator=generator).tolist()
        response = ((cycle[phase:] + cycle[:phase]) * 5)[:48]
        samples.append(Sample(f"s{i}", tuple(prompt), tuple(response)))
    return samples


def tiny_config(out, **overrides) -> DrafterTrainConfig:
    settings = dict(
        out=str(out), block_size=4, mask_token_id=3, taps=(0, 1, 3), batch_size=4,
        anchors_per_seq=8, heldout=4, eval_every=10, save_every=100, lr=3e-3, autocast=False,
        **TINY_RUN,
    )  # fmt: skip
    return DrafterTrainConfig(**{**settings, **overrides})


def test_tiny_overfit_raises_simulated_acceptance(tiny_llama_target, tmp_path):
    config = tiny_config(tmp_path / "run", max_steps=40)
    result = train(config, target=tiny_llama_target, samples=cyclic_corpus(), progress_bar=False)
    assert result["initial"]["accept"] < 1.5
    assert result["final"]["accept"] > result["initial"]["accept"] + 1.0  # block 4: at most 4
    drafter = load_drafter(result["drafter"], tiny_llama_target)
    assert drafter.config.block_size == 4
    provenance = json.loads((tmp_path / "run" / "drafter" / "provenance.json").read_text())
    assert provenance["steps"] == 40 and provenance["tokens_seen"] > 0
    assert provenance["final_heldout"]["accept"] == result["final"]["accept"]
    assert {"torch", "transformers", "dcoco"} <= set(provenance["versions"])
    events = [json.loads(line)["event"] for line in (tmp_path / "run" / "train_log.jsonl").open()]
    assert events[0] == "start" and events.count("train") == 40 and events[-1] == "done"


def test_interrupted_run_resumes_to_the_same_weights(tiny_llama_target, tmp_path, monkeypatch):
    samples = cyclic_corpus(12)
    straight = train(
        tiny_config(tmp_path / "straight", max_steps=6, save_every=3),
        target=tiny_llama_target, samples=samples, progress_bar=False,
    )  # fmt: skip

    real_batch_at = loop._batch_at

    def interrupt_at_step_4(samples, step, batch_size, seed):
        if step == 4:
            raise KeyboardInterrupt
        return real_batch_at(samples, step, batch_size, seed)

    config = tiny_config(tmp_path / "resumed", max_steps=6, save_every=3)
    monkeypatch.setattr(loop, "_batch_at", interrupt_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        train(config, target=tiny_llama_target, samples=samples, progress_bar=False)
    monkeypatch.setattr(loop, "_batch_at", real_batch_at)
    resumed = train(config, target=tiny_llama_target, samples=samples, progress_bar=False)

    assert resumed["steps"] == 6 and resumed["tokens"] == straight["tokens"]
    log = [json.loads(line) for line in (tmp_path / "resumed" / "train_log.jsonl").open()]
    assert [r["step"] for r in log if r["event"] == "resume"] == [3]
    first = load_drafter(straight["drafter"], tiny_llama_target, dtype=torch.float32)
    second = load_drafter(resumed["drafter"], tiny_llama_target, dtype=torch.float32)
    for name, weight in first.state_dict().items():
        torch.testing.assert_close(second.state_dict()[name], weight, rtol=0, atol=0)


def test_resume_refuses_another_drafter_shape(tiny_llama_target, tmp_path):
    samples = cyclic_corpus(8)
    train(tiny_config(tmp_path, max_steps=1), target=tiny_llama_target, samples=samples,
          progress_bar=False)  # fmt: skip
    with pytest.raises(DcocoError, match="another drafter"):
        train(tiny_config(tmp_path, max_steps=2, block_size=5), target=tiny_llama_target,
              samples=samples, progress_bar=False)  # fmt: skip


def test_cli_flags_cover_every_field():
    import argparse

    parser = argparse.ArgumentParser()
    drafter_train.COMMAND.add_to(parser.add_subparsers())
    args = parser.parse_args(["train-drafter", "--taps", "1,14,27", "--no-autocast"])
    config = config_from_args(DrafterTrainConfig, args)
    assert config.taps == (1, 14, 27) and config.autocast is False
    # What the flags leave empty comes from the target's registry entry and dcoco.paths.
    resolved = drafter_train.with_target_defaults(replace(config, taps=()))
    assert resolved.corpus == str(paths.default_corpus("smollm2-135m-instruct"))
    assert resolved.mask_token_id == 16 and resolved.taps == (1, 14, 27)
    with pytest.raises(DcocoError, match="no default mask token"):
        drafter_train.with_target_defaults(replace(config, target="/some/model/dir"))
