"""Block construction rules for DFlash training: anchors, inputs, same-position labels, mask."""

from __future__ import annotations

import math

import torch

from dcoco.train.blocks import (
    IGNORE,
    acceptance_stats,
    block_attention_mask,
    block_inputs_and_labels,
    sample_anchors,
    slot_weights,
)

MASK = 3


def response_mask(prompt: int, response: int) -> torch.Tensor:
    mask = torch.zeros(prompt + response, dtype=torch.bool)
    mask[prompt:] = True
    return mask


def test_anchors_are_response_positions_with_full_blocks():
    loss_mask = response_mask(10, 30)
    for seed in range(5):
        anchors = sample_anchors(loss_mask, 8, 4, torch.Generator().manual_seed(seed))
        assert anchors.numel() == 8
        assert torch.all(anchors[1:] > anchors[:-1])  # sorted and distinct
        assert anchors.min() >= 10 and anchors.max() + 4 <= 40


def test_anchors_take_every_candidate_when_few_and_none_when_too_short():
    assert sample_anchors(response_mask(5, 6), 100, 4).tolist() == [5, 6, 7]
    assert sample_anchors(response_mask(5, 3), 100, 4).numel() == 0


def test_labels_are_same_position_not_shifted():
    ids = (100 + torch.arange(20))[None]  # token at position p is 100 + p
    anchors = torch.tensor([[4, 11]])
    block_ids, positions, labels = block_inputs_and_labels(ids, anchors, 4, MASK)
    assert block_ids.tolist() == [[104, MASK, MASK, MASK, 111, MASK, MASK, MASK]]
    assert positions.tolist() == [[4, 5, 6, 7, 11, 12, 13, 14]]
    # slot k of the block at anchor a is labelled x[a + k]; slot 0 carries no loss
    assert labels.tolist() == [[IGNORE, 105, 106, 107, IGNORE, 112, 113, 114]]


def test_labels_past_the_end_are_ignored():
    ids = torch.arange(10)[None]
    _, _, labels = block_inputs_and_labels(ids, torch.tensor([[8]]), 4, MASK)
    assert labels.tolist() == [[IGNORE, 9, IGNORE, IGNORE]]


def test_mask_context_is_strictly_before_the_anchor():
    anchors = torch.tensor([[3, 6]])
    mask = block_attention_mask(anchors, seq_len=8, block_size=2)
    assert mask.shape == (1, 1, 4, 8 + 4)
    rows = mask[0, 0].int().tolist()
    #         context 0..7            blocks (2 x 2)
    assert rows[0] == [1, 1, 1, 0, 0, 0, 0, 0] + [1, 1, 0, 0]
    assert rows[1] == [1, 1, 1, 0, 0, 0, 0, 0] + [1, 1, 0, 0]
    assert rows[2] == [1, 1, 1, 1, 1, 1, 0, 0] + [0, 0, 1, 1]
    assert rows[3] == [1, 1, 1, 1, 1, 1, 0, 0] + [0, 0, 1, 1]


def test_mask_hides_padding():
    valid = torch.tensor([[True, False, True, True, True]])
    mask = block_attention_mask(torch.tensor([[4]]), 5, 2, context_valid=valid)
    assert mask[0, 0, 0, :5].tolist() == [True, False, True, True, False]


def test_slot_weights_decay_from_the_first_draft():
    weights = slot_weights(16, 7.0)
    assert weights.shape == (16,)
    assert weights[0] == 0 and weights[1] == 1
    assert math.isclose(weights[8].item(), math.exp(-1.0), rel_tol=1e-6)


def test_acceptance_counts_the_prefix_plus_bonus():
    correct = torch.tensor([[True, True, False, True], [False, True, True, True]])
    slot_acc, accepted = acceptance_stats(correct)
    assert accepted.tolist() == [3.0, 1.0]
    assert slot_acc.tolist() == [0.5, 1.0, 0.5, 1.0]
