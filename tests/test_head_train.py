"""Head training end to end on a tiny target: a corrector learns what a parallel drafter cannot
(which of two continuations a block is in), and its checkpoint decodes losslessly."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_RUN

from dcoco.data.distill import Sample
from dcoco.decode.engine import Engine
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.train.block_pass import LossVocab
from dcoco.train.blocks import IGNORE
from dcoco.train.drafter_train import DrafterTrainConfig
from dcoco.train.drafter_train import train as train_drafter
from dcoco.train.head_train import HeadTrainConfig
from dcoco.train.head_train import train as train_head

pytestmark = pytest.mark.usefixtures("one_thread")
SHARED = dict(
    block_size=4, mask_token_id=3, taps=(0, 1, 3), batch_size=4, anchors_per_seq=24, heldout=4,
    eval_every=1000, save_every=1000, lr=3e-3, anchor_chunk=8, **TINY_RUN,
)  # fmt: skip


def two_mode_corpus(count: int = 32) -> list[Sample]:
    """Segments `10 a b c`, where (a, b, c) is (20, 21, 22) or (30, 31, 32) at random.

    After the anchor 10 each slot alone is a coin flip between the modes, so a parallel drafter's
    argmax often mixes them (20, 31, ...); which pair follows which is certain, so a corrector
    over the top-K candidates can keep a block in one mode."""
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i in range(count):
        prompt = torch.randint(40, 128, (5,), generator=generator).tolist()
        response = []
        for _ in range(12):
            mode = int(torch.randint(0, 2, (1,), generator=generator))
            response += [10, *([20, 21, 22] if mode == 0 else [30, 31, 32])]
        samples.append(Sample(f"s{i}", tuple(prompt), tuple(response)))
    return samples


def tiny_drafter(target, tmp_path, samples: list[Sample], steps: int) -> dict:
    config = DrafterTrainConfig(out=str(tmp_path / "drafter"), max_steps=steps, **SHARED)
    return train_drafter(config, target=target, samples=samples, progress_bar=False)


def test_dropin_corrector_beats_its_frozen_drafter(tiny_llama_target, tmp_path):
    samples = two_mode_corpus()
    drafter = tiny_drafter(tiny_llama_target, tmp_path, samples, 40)
    config = HeadTrainConfig(
        out=str(tmp_path / "dcoco"), init=drafter["drafter"], mode="dropin", max_steps=80,
        top_k=4, mlp_hidden=32, **{**SHARED, "lr": 3e-2},
    )  # fmt: skip
    result = train_head(config, target=tiny_llama_target, samples=samples, progress_bar=False)
    final = result["final"]
    # The drafter is frozen: its own acceptance cannot move, the head's must rise above it.
    assert final["drafter_accept"] == pytest.approx(result["initial"]["drafter_accept"])
    assert result["initial"]["accept"] == pytest.approx(result["initial"]["drafter_accept"])
    assert final["accept"] > final["drafter_accept"] + 0.15
    stored = json.loads((tmp_path / "dcoco" / "dcoco" / "config.json").read_text())
    assert stored["architectures"] == ["DFlashDcocoDraftModel"]
    assert stored["dcoco_head"]["top_k"] == 4
    assert json.loads((tmp_path / "dcoco" / "dcoco" / "provenance.json").read_text())["steps"] == 80

    # The trained head decodes losslessly in the engine, under the method spec grammar.
    proposer = build_proposer(f"dcoco@{result['drafter']}", tiny_llama_target, MethodOptions())
    prompt = [*samples[0].prompt_ids, 10, 20, 21, 22, 10]
    plain = Engine(tiny_llama_target).generate(prompt, 30)
    corrected = Engine(tiny_llama_target, proposer).generate(prompt, 30)
    assert corrected.new_ids == plain.new_ids


def test_joint_training_moves_the_drafter_too(tiny_llama_target, tmp_path):
    samples = two_mode_corpus(16)
    drafter = tiny_drafter(tiny_llama_target, tmp_path, samples, 4)
    config = HeadTrainConfig(
        out=str(tmp_path / "joint"), init=drafter["drafter"], mode="joint", max_steps=6,
        top_k=4, mlp_hidden=16, **SHARED,
    )  # fmt: skip
    result = train_head(config, target=tiny_llama_target, samples=samples, progress_bar=False)
    assert result["final"]["drafter_loss"] < result["initial"]["drafter_loss"]
    with pytest.raises(DcocoError, match="another kind of run"):
        train_drafter(
            DrafterTrainConfig(out=str(tmp_path / "joint"), max_steps=8, init=drafter["drafter"],
                               **SHARED),
            target=tiny_llama_target, samples=samples, progress_bar=False,
        )  # fmt: skip


def test_a_dcoco_method_refuses_a_checkpoint_without_its_head(tiny_llama_target, tmp_path):
    samples = two_mode_corpus(8)
    drafter = tiny_drafter(tiny_llama_target, tmp_path, samples, 1)
    with pytest.raises(DcocoError, match="no draft head"):
        build_proposer(f"dcoco@{drafter['drafter']}", tiny_llama_target, MethodOptions())
    with pytest.raises(DcocoError, match="needs --init"):
        HeadTrainConfig(out=str(tmp_path), **SHARED)
    with pytest.raises(DcocoError, match="unknown mode"):
        HeadTrainConfig(out=str(tmp_path), init="x", mode="sideways", **SHARED)


def test_loss_vocab_keeps_the_most_frequent_reply_tokens(tiny_llama_target):
    config = DrafterConfig.for_target(tiny_llama_target, num_layers=1, block_size=4,
                                      mask_token_id=3, target_layer_ids=(0, 1))  # fmt: skip
    drafter = BlockDrafter(config, tiny_llama_target.embed_tokens, tiny_llama_target.lm_head)
    samples = [Sample("a", (50, 51), (7, 7, 7, 9, 9, 11)), Sample("b", (52,), (9, 12))]
    vocab = LossVocab.most_frequent(drafter, samples, 2)
    assert vocab.vocab_ids.tolist() == [7, 9]  # prompts do not count; 11 and 12 lose on count
    assert vocab.label_index(torch.tensor([9, 7, 11])).tolist() == [1, 0, IGNORE]
    hidden = torch.randn(3, 64)
    full = tiny_llama_target.lm_head(hidden)
    torch.testing.assert_close(vocab.logits(hidden), full[:, [7, 9]])
    assert LossVocab.most_frequent(drafter, samples, 0).vocab_ids is None


@pytest.mark.parametrize(
    "flags", [dict(use_pair_state=False), dict(use_candidate_repr=False), dict(top_k=0)]
)
def test_head_fields_pass_ablation_flags_and_leave_unset_sizes_to_defaults(flags):
    drafter = SimpleNamespace(config=SimpleNamespace(hidden_size=64, vocab_size=128))
    config = HeadTrainConfig(head="dcoco", init="unused", mlp_hidden=0, **flags)
    fields = config.head_fields(drafter)
    for name, value in flags.items():
        assert fields[name] == value  # a False flag is a choice, not an unset size
    assert "mlp_hidden" not in fields  # 0 = the head's own default width


def test_a_run_from_a_checkpoint_with_a_head_continues_that_head(tiny_llama_target, tmp_path):
    samples = two_mode_corpus(16)
    drafter = tiny_drafter(tiny_llama_target, tmp_path, samples, 4)
    head_flags = dict(mode="dropin", top_k=4, mlp_hidden=32, **{**SHARED, "lr": 3e-2})
    first = train_head(
        HeadTrainConfig(out=str(tmp_path / "a"), init=drafter["drafter"], max_steps=20,
                        **head_flags),
        target=tiny_llama_target, samples=samples, progress_bar=False,
    )  # fmt: skip
    # the drafter is frozen, so only the head moves the loss: one step on from the trained
    # checkpoint starts where the first run ended (up to the checkpoint's bf16 rounding), not at
    # the zero head's loss
    again = train_head(
        HeadTrainConfig(out=str(tmp_path / "b"), init=first["drafter"], max_steps=1, **head_flags),
        target=tiny_llama_target, samples=samples, progress_bar=False,
    )  # fmt: skip
    assert again["initial"]["loss"] == pytest.approx(first["final"]["loss"], rel=2e-3)
    # ... and that is a claim only because the head moved the loss well beyond that tolerance
    assert first["initial"]["loss"] != pytest.approx(first["final"]["loss"], rel=5e-3)
    with pytest.raises(DcocoError, match="other settings"):  # a different head: never silent
        train_head(
            HeadTrainConfig(out=str(tmp_path / "c"), init=first["drafter"], max_steps=1,
                            **{**head_flags, "top_k": 2}),
            target=tiny_llama_target, samples=samples, progress_bar=False,
        )  # fmt: skip
