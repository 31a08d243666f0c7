"""Records side by side in one drafter forward (`--records-per-forward`): the batched pass equals
the record-by-record one block for block, and training with it follows the same curve at fp32."""

from __future__ import annotations

import json

import pytest
import torch

from dcoco.data.distill import Sample
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.train.block_pass import AnchorRule, block_chunks, prepare_item, record_chunks
from dcoco.train.drafter_train import train
from dcoco.train.target_features import TargetFeatures
from tests.test_copy_hints import hinted_drafter
from tests.test_drafter_train import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def uneven_corpus(count: int = 6) -> list[Sample]:
    """Replies of different lengths that repeat themselves (copy hints find matches)."""
    generator = torch.Generator().manual_seed(1)
    samples = []
    for i in range(count):
        prompt = torch.randint(40, 128, (5 + i,), generator=generator).tolist()
        phrase = torch.randint(20, 40, (6,), generator=generator).tolist()
        reply = (phrase * 8)[: 20 + 7 * i]
        samples.append(Sample(f"u{i}", tuple(prompt), tuple(reply)))
    return samples


@pytest.mark.parametrize("window", [0, 6])
def test_records_side_by_side_equal_one_record_at_a_time(tiny_llama_target, window):
    target = tiny_llama_target
    drafter = hinted_drafter(target, gated=True)
    features = TargetFeatures(target, drafter.config.target_layer_ids, "")
    rule = AnchorRule(64, stride=3)
    items = [
        prepare_item(s, features, rule, 5, torch.Generator().manual_seed(i), 0, "cpu")
        for i, s in enumerate(uneven_corpus())
    ]
    assert len({item.anchors.numel() for item in items}) > 1  # the anchors need padding too
    with torch.no_grad():
        alone = [list(block_chunks(drafter, item, 4, window)) for item in items]
        batched = list(record_chunks(drafter, items, 4, window))
    # forward j holds the j-th chunk of every record that has one, record by record
    forwards = max(map(len, alone))
    expected = [chunks[j] for j in range(forwards) for chunks in alone if j < len(chunks)]
    got = torch.cat([chunk.hidden for chunk in batched])
    torch.testing.assert_close(got, torch.cat([c.hidden for c in expected]), atol=1e-5, rtol=1e-5)
    for name in ("anchor_ids", "label_ids", "hint_ids"):
        want = torch.cat([getattr(c, name) for c in expected])
        assert torch.equal(torch.cat([getattr(c, name) for c in batched]), want), name


def test_training_follows_the_same_curve_with_records_side_by_side(tiny_llama_target, tmp_path):
    losses, weights = {}, {}
    for per_forward in (1, 3):
        out = tmp_path / str(per_forward)
        config = tiny_config(
            out, max_steps=4, batch_size=3, records_per_forward=per_forward, anchor_chunk=4,
            copy_hints=True, heldout=1, eval_every=100,
        )  # fmt: skip
        result = train(config, target=tiny_llama_target, samples=uneven_corpus(8),
                       progress_bar=False)  # fmt: skip
        log = [json.loads(line) for line in (out / "train_log.jsonl").open()]
        losses[per_forward] = [r["loss"] for r in log if r["event"] == "train"]
        weights[per_forward] = load_drafter(result["drafter"], tiny_llama_target).state_dict()
        assert result["final"]["accept"] >= 1.0
    assert losses[1] == pytest.approx(losses[3], rel=1e-5)
    for name, value in weights[1].items():  # saved in bf16: at most one rounding step apart
        torch.testing.assert_close(weights[3][name], value, atol=1e-6, rtol=2**-7)


def test_records_per_forward_must_be_positive(tmp_path):
    with pytest.raises(DcocoError, match="records_per_forward"):
        tiny_config(tmp_path, records_per_forward=0)
