"""Sampled drafts in vLLM: the plugin's own draw over a draft vocabulary's columns (plain torch),
and a step of sampled requests drafting from the drafter without the head (the vLLM venv)."""

from __future__ import annotations

import pytest
import torch
from test_vllm_schedule import CHECKPOINT, ENV, PROMPTS, TARGET, _generate

from dcoco.paths import checkpoints_dir
from dcoco.serving.vllm.draft_sampling import draw

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


@pytest.mark.vllm
def test_sampled_drafts_skip_the_head_in_steps_of_sampled_requests(monkeypatch):
    """With `draft_sample_method: probabilistic` (as `dcoco serve` sets it) a step whose requests
    are all sampled drafts from the drafter's distribution, drawn by the plugin
    (dcoco.serving.vllm.draft_sampling): the head never picks there, and vLLM gets draft
    probabilities to verify against. Greedy fp32 output still equals plain vLLM's, the
    head picking its drafts."""
    pytest.importorskip("vllm")
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    from dcoco.models.heads import head_compile
    from dcoco.serving.vllm import model as vllm_model

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    picks, probabilities, draws = [], [], []
    select, take = head_compile.select_draft, SpecDecodeBaseProposer.take_last_draft_probs

    def counted(head, hidden, *args):
        picks.append(hidden.shape[0])
        return select(head, hidden, *args)

    def taken(self):
        probs = take(self)
        probabilities.append(probs is not None)
        return probs

    def drawn(logits, *args):
        draws.append(logits.shape[-1])  # over the drafter's columns
        return original_draw(logits, *args)

    original_draw = vllm_model.draw
    monkeypatch.setattr(head_compile, "select_draft", counted)
    monkeypatch.setattr(SpecDecodeBaseProposer, "take_last_draft_probs", taken)
    monkeypatch.setattr(vllm_model, "draw", drawn)
    speculative = {
        "method": "dflash",
        "model": str(checkpoints_dir() / TARGET / CHECKPOINT),
        "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic",
    }
    _generate(speculative, (1.0,) * len(PROMPTS))
    assert picks == [] and any(probabilities) and draws  # our draw over the columns
    assert _generate(speculative) == _generate(None)
    assert picks  # greedy steps keep the head
