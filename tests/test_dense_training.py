"""The trainer with dense anchors and its bookkeeping: it learns, it logs what a reader of the
curves needs (gradient norms, τ at 3 slots, the bigram baseline), autocast is applied, and slots
outside a loss vocabulary do not dilute the logged loss."""

from __future__ import annotations

import json

import pytest
import torch

from dcoco.data.distill import Sample
from dcoco.train import loop, step
from dcoco.train.block_pass import AnchorRule, prepare_item
from dcoco.train.drafter_train import train
from tests.test_drafter_train import cyclic_corpus, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def read_log(path) -> list[dict]:
    return [json.loads(line) for line in (path / "train_log.jsonl").open()]


def test_dense_anchors_learn_and_the_log_carries_the_curve_fields(tiny_llama_target, tmp_path):
    config = tiny_config(tmp_path, max_steps=30, anchor_stride=2)
    result = train(config, target=tiny_llama_target, samples=cyclic_corpus(), progress_bar=False)
    assert result["final"]["accept"] > result["initial"]["accept"] + 1.0
    log = read_log(tmp_path)
    trains = [r for r in log if r["event"] == "train"]
    # Every reply offers (48 - 4 + 1) anchors; stride 2 takes about half of them per sequence.
    assert all(4 * 21 <= r["blocks"] <= 4 * 23 for r in trains)
    assert all(r["grad_norm"] > 0 for r in trains)
    baseline = next(r for r in log if r["event"] == "baseline")
    # The cyclic corpus is a perfect bigram at every distance: the table gets every slot right.
    assert baseline["slot_acc"] == [1.0, 1.0, 1.0] and baseline["tau_3"] == 4.0
    final = [r for r in log if r["event"] == "eval"][-1]
    assert 1.0 <= final["tau_3"] <= final["accept"] <= 4.0


def test_autocast_is_applied(tiny_llama_target, tmp_path):
    samples = cyclic_corpus(8)
    losses = {}
    for autocast in (False, True):
        out = tmp_path / str(autocast)
        train(tiny_config(out, max_steps=1, autocast=autocast), target=tiny_llama_target,
              samples=samples, progress_bar=False)  # fmt: skip
        losses[autocast] = next(r for r in read_log(out) if r["event"] == "train")["loss"]
    assert losses[True] != losses[False]  # bf16 rounding shows: the flag reaches the forward
    assert abs(losses[True] - losses[False]) < 0.05 * losses[False]


def test_slots_outside_the_loss_vocab_do_not_dilute_the_loss(tiny_llama_target, tmp_path):
    """A sequence whose labels all fall outside the loss vocabulary adds no loss and no weight."""
    common = cyclic_corpus(8)
    rare = Sample("rare", (50, 51), tuple(range(100, 124)))  # tokens the cyclic replies never use
    config = tiny_config(tmp_path, max_steps=1, loss_vocab=10)
    run = loop.setup(config, tiny_llama_target, [*common, rare], None)
    assert run.loss_vocab.vocab_ids.tolist() == list(range(20, 30))

    def item(sample):
        generator = torch.Generator().manual_seed(0)  # the same anchors in both calls
        return prepare_item(sample, run.features, AnchorRule(8), 4, generator, 0, "cpu")

    alone = step.step_losses(run, [item(common[0])], run.loss_vocab, backward=False)
    mixed = step.step_losses(run, [item(common[0]), item(rare)], run.loss_vocab, backward=False)
    assert mixed["loss"] == pytest.approx(alone["loss"], rel=1e-6)
    assert mixed["blocks"] > alone["blocks"]


def test_snapshot_and_curves_report_the_run(tiny_llama_target, tmp_path):
    from dcoco.eval.train_curves import TrainCurvesConfig
    from dcoco.eval.train_curves import run as curves
    from dcoco.models.drafter.drafter_io import load_drafter

    out = tmp_path / "run-a"
    config = tiny_config(out, max_steps=20, save_every=10, eval_every=10, anchor_stride=2)
    train(config, target=tiny_llama_target, samples=cyclic_corpus(), progress_bar=False)
    snapshot = load_drafter(out / "snapshot", tiny_llama_target)  # saved with the step-20 state
    assert json.loads((out / "snapshot" / "provenance.json").read_text())["steps"] == 20
    final = load_drafter(out / "drafter", tiny_llama_target)
    for name, weight in final.state_dict().items():
        torch.testing.assert_close(snapshot.state_dict()[name], weight)
    assert curves(TrainCurvesConfig(runs=(str(out),), out=str(tmp_path / "curves"))) == 0
    report = json.loads((tmp_path / "curves" / "curves.json").read_text())
    evals = [r for r in read_log(out) if r["event"] == "eval"]
    (row,) = report["rows"]
    assert row["run"] == "run-a" and row["steps"] == 20
    assert row["slot_acc"] == evals[-1]["slot_acc"][:3] and row["tau_3"] == evals[-1]["tau_3"]
    assert row["bigram_slot_acc"] == [1.0, 1.0, 1.0]
    assert [e["step"] for e in report["curves"]["run-a"]] == [0, 10, 20]
    assert "| run-a | 20 |" in (tmp_path / "curves" / "curves.md").read_text()
