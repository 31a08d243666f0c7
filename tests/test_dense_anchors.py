"""Dense anchors: strided anchors cover every reply position once over `stride` epochs, and
overlapping blocks trained side by side stay blind to each other and to their own anchor's
feature (the leak reported with many anchors per sequence)."""

from __future__ import annotations

import torch

from dcoco.data.distill import Sample
from dcoco.train.block_pass import AnchorRule
from dcoco.train.blocks import strided_anchors
from tests.test_blocks import response_mask
from tests.test_drafter import BLOCK, training_forward
from tests.test_drafter import setup as setup  # noqa: F401 (the drafter fixture)


def test_strided_anchors_cover_every_position_once_per_stride_epochs():
    loss_mask = response_mask(7, 30)
    usable = set(range(7, 37 - 4 + 1))  # anchor + block (4) stays inside the sequence
    seen = []
    for epoch in range(3):
        anchors = strided_anchors(loss_mask, 3, epoch % 3, 4)
        assert torch.all(anchors[1:] - anchors[:-1] == 3)
        seen += anchors.tolist()
    assert sorted(seen) == sorted(usable)  # each usable position exactly once


def test_anchor_rule_visits_every_reply_position_over_stride_epochs():
    sample = Sample("r", tuple(range(4, 9)), tuple(range(20, 60)))
    rule = AnchorRule(per_seq=0, stride=4)
    epochs = [set(rule.anchors(sample, 8, epoch, None).tolist()) for epoch in range(4)]
    assert all(not (a & b) for i, a in enumerate(epochs) for b in epochs[i + 1 :])  # disjoint
    assert set().union(*epochs) == set(range(5, sample.num_tokens - 8 + 1))
    assert epochs[0] == set(rule.anchors(sample, 8, 4, None).tolist())  # period = stride
    # A run seeded 2 starts where a seed-0 run's third epoch would.
    shifted = AnchorRule(per_seq=0, stride=4, shift=2)
    assert set(shifted.anchors(sample, 8, 0, None).tolist()) == epochs[2]


def test_overlapping_blocks_see_neither_each_other_nor_their_anchor_feature(setup):  # noqa: F811
    """Anchors one position apart: block j's span holds the next blocks' anchors. A perturbed
    feature at anchor a_j must leave block j (and every earlier block) unchanged, and a perturbed
    anchor token must change only its own block. Fails if the mask's `<` becomes `<=`."""
    _, drafter, ids, features = setup
    anchors = [12, 13, 14, 15]
    assert anchors[-1] - anchors[0] < BLOCK  # every pair of blocks overlaps
    base = training_forward(drafter, ids, features, anchors)

    for j, anchor in enumerate(anchors):
        changed = features.clone()
        changed[:, anchor] += 5.0
        moved = training_forward(drafter, ids, changed, anchors)
        for i in range(len(anchors)):
            if i <= j:  # its own anchor's feature, or a later position: invisible
                torch.testing.assert_close(moved[:, i], base[:, i])
            else:  # strictly before block i's anchor: visible
                assert not torch.allclose(moved[:, i], base[:, i])

    for j, anchor in enumerate(anchors):
        other = ids.clone()
        other[0, anchor] = (other[0, anchor] + 1) % 128
        moved = training_forward(drafter, other, features, anchors)
        for i in range(len(anchors)):
            same = torch.allclose(moved[:, i], base[:, i], atol=1e-6)
            assert same == (i != j), (i, j)


def test_context_window_shows_only_the_last_positions_before_the_anchor():
    from dcoco.train.blocks import block_attention_mask

    mask = block_attention_mask(torch.tensor([[5, 9]]), seq_len=10, block_size=2, window=3)
    rows = mask[0, 0].int().tolist()
    assert rows[0][:10] == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0]  # 2, 3, 4: the 3 before anchor 5
    assert rows[2][:10] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 0]  # 6, 7, 8 before anchor 9
    full = block_attention_mask(torch.tensor([[5, 9]]), seq_len=10, block_size=2)
    assert full[0, 0, 0, :10].sum() == 5 and full[0, 0, 2, :10].sum() == 9


def test_the_curriculum_window_doubles_then_covers_everything():
    from types import SimpleNamespace

    from dcoco.train.step import context_window

    config = SimpleNamespace(context_window=16, window_doubling_steps=10, max_seq_len=100)
    assert [context_window(config, s) for s in (0, 9, 10, 25, 30)] == [16, 16, 32, 64, 0]
    assert context_window(SimpleNamespace(context_window=0), 5) == 0
