"""The plugin's own draw of sampled drafts over a draft vocabulary's columns (no vLLM needed)."""

from __future__ import annotations

import torch

from dcoco.serving.vllm_draft_sampling import draw

VOCAB = 12


def test_q_is_the_tempered_softmax_spread_over_every_token():
    generator = torch.Generator().manual_seed(0)
    columns = torch.tensor([1, 4, 7, 10])
    logits = torch.randn(3, len(columns), generator=generator)  # [rows, columns]
    temperature = torch.tensor([1.0, 0.5, 0.0])  # the last row greedy
    tokens, q = draw(logits, columns, VOCAB, temperature)
    assert q.shape == (3, VOCAB)
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[columns] = False
    assert q[:, outside].abs().max() == 0
    torch.testing.assert_close(q[0, columns], logits[0].softmax(-1))
    torch.testing.assert_close(q[1, columns], (logits[1] / 0.5).softmax(-1))
    assert set(tokens.tolist()) <= set(columns.tolist())
    assert tokens[2] == columns[logits[2].argmax()]  # greedy: the argmax


def test_draws_follow_q():
    torch.manual_seed(3)  # vLLM's drafts use the global generator; so does draw
    logits = torch.tensor([[1.5, 0.5, 0.0, -1.0]]).expand(6000, -1)
    tokens, q = draw(logits, None, 4, torch.full((6000,), 0.8))
    frequency = torch.bincount(tokens, minlength=4).float() / len(tokens)
    torch.testing.assert_close(frequency, q[0], atol=0.025, rtol=0)
