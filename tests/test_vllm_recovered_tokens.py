"""The recovered token of a rejected draft (dcoco.serving.vllm.recovered_tokens, plain torch):
a draw from the residual max(p - q, 0), by each position's own uniform."""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.serving.vllm.recovered_tokens import recovered_tokens


def _frequencies(tokens: Tensor, vocab: int) -> Tensor:
    return torch.bincount(tokens.long(), minlength=vocab).float() / len(tokens)


def test_recovered_tokens_follow_the_residual():
    torch.manual_seed(0)
    p = torch.tensor([0.1, 0.4, 0.3, 0.2])
    q = torch.tensor([0.3, 0.1, 0.3, 0.3])  # residual (0, 0.3, 0, 0) -> token 1 only
    q2 = torch.tensor([0.0, 0.2, 0.2, 0.6])  # residual (0.1, 0.2, 0.1, 0) / 0.4
    rows = 6000
    draft_ids = torch.zeros(2 * rows, dtype=torch.int32)
    draft_probs = torch.cat([q.expand(rows, -1), q2.expand(rows, -1)])
    target_probs = p.expand(2 * rows, -1).contiguous()
    tokens = recovered_tokens(draft_ids, draft_probs, target_probs, [2] * rows, {})
    assert tokens.dtype == torch.int32 and tokens.shape == (2 * rows,)
    assert (tokens[:rows] == 1).all()
    torch.testing.assert_close(
        _frequencies(tokens[rows:], 4), torch.tensor([0.25, 0.5, 0.25, 0.0]), atol=0.025, rtol=0
    )


def test_a_point_mass_draft_is_never_its_own_recovery():
    torch.manual_seed(1)
    p = torch.tensor([0.5, 0.25, 0.25])
    draft_ids = torch.tensor([0, 1] * 3000)
    tokens = recovered_tokens(draft_ids, None, p.expand(6000, -1).contiguous(), [2] * 3000, {})
    assert (tokens != draft_ids).all()
    torch.testing.assert_close(  # drafts of 0: tokens 1 and 2 alike
        _frequencies(tokens[0::2], 3), torch.tensor([0.0, 0.5, 0.5]), atol=0.03, rtol=0
    )


def test_equal_distributions_fall_back_to_the_target():
    p = torch.tensor([[0.0, 1.0, 0.0]])
    tokens = recovered_tokens(torch.tensor([1]), p.clone(), p, [1], {})
    assert tokens.tolist() == [1]


def test_a_seeded_request_draws_from_its_own_generator():
    p = torch.softmax(torch.randn(5, 50, generator=torch.Generator().manual_seed(2)), -1)
    draft_ids = torch.zeros(5, dtype=torch.int64)

    def run(seed_of_second: int) -> Tensor:
        generators = {1: torch.Generator().manual_seed(seed_of_second)}
        return recovered_tokens(draft_ids, None, p, [2, 3], generators)

    torch.manual_seed(3)
    first = run(7)
    torch.manual_seed(4)  # the unseeded request's draws move, the seeded one's stay
    second = run(7)
    assert torch.equal(first[2:], second[2:])


def test_a_row_without_mass_still_gets_a_token():
    nan = torch.full((1, 4), float("nan"))
    tokens = recovered_tokens(torch.tensor([2]), None, nan, [1], {})
    assert 0 <= tokens.item() < 4
