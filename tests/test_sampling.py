import math

import pytest
import torch

from dcoco.contracts import SamplingParams
from dcoco.decode.sampling import logits_to_probs, sample, sample_from_logits


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_is_one_hot_with_lowest_index_on_ties():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 0.0, 0.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    assert probs.dtype == torch.float32


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.float64)
    probs = logits_to_probs(logits, SamplingParams(temperature=0.5))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.softmax(logits.float() * 2.0, dim=-1))


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0, 1.5])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    e = math.exp(1.0)
    torch.testing.assert_close(probs, torch.tensor([0.0, e / (e + 1), 1 / (e + 1), 0.0, 0.0]))
    # A tie at the boundary still leaves exactly k tokens.
    tied = torch.tensor([1.0, 3.0, 2.0, 0.0, 2.0])
    assert int((logits_to_probs(tied, SamplingParams(temperature=1.0, top_k=2)) > 0).sum()) == 2


def test_top_p_keeps_smallest_prefix_reaching_mass():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    wide = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.9))
    torch.testing.assert_close(wide, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_top_p_keeps_at_least_the_top_token():
    logits = torch.tensor([[0.1, 0.2, 0.3], [1.0, 1.0, 1.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=1e-6))
    assert torch.equal(probs, torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=0.9, top_k=4, top_p=0.6),
        SamplingParams(temperature=0.0),
    ],
)
def test_probs_sum_to_one_for_any_leading_dims(params):
    logits = torch.randn(2, 3, 12, generator=_gen(1)) * 3
    probs = logits_to_probs(logits, params)
    assert probs.shape == logits.shape
    assert (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))
    if params.top_k:
        assert ((probs > 0).sum(-1) <= params.top_k).all()


def test_sample_shape_and_point_masses():
    probs = torch.zeros(2, 3, 8)
    targets = torch.tensor([[0, 7, 3], [5, 5, 1]])
    probs.scatter_(-1, targets[..., None], 1.0)
    draws = sample(probs, _gen())
    assert draws.dtype == torch.int64
    assert torch.equal(draws, targets)
    assert sample(torch.zeros(0, 8), _gen()).shape == (0,)


def test_sample_frequencies_follow_probs():
    probs = torch.tensor([0.1, 0.6, 0.3])
    draws = sample(probs.expand(20_000, 3), _gen(2))
    freq = torch.bincount(draws, minlength=3).float() / draws.numel()
    assert (freq - probs).abs().sum() / 2 < 0.02


def test_sample_never_draws_a_token_of_zero_mass():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.0, 0.5, 0.0])  # zeros first, between and last
    draws = sample(probs.expand(20_000, -1), _gen(6))
    assert set(draws.tolist()) == {1, 4}
    last = sample(torch.tensor([[0.0, 0.0, 2.5]]).expand(100, -1), _gen(7))  # unnormalised
    assert (last == 2).all()
    with pytest.raises(ValueError, match="positive mass"):
        sample(torch.zeros(2, 4), _gen())


def test_sample_from_logits():
    logits = torch.randn(4, 10, generator=_gen(3))
    greedy = sample_from_logits(logits, SamplingParams(temperature=0.0))
    assert torch.equal(greedy, logits.argmax(-1))
    top1 = sample_from_logits(logits, SamplingParams(temperature=1.0, top_k=1), _gen(4))
    assert torch.equal(top1, logits.argmax(-1))
    seeded = [sample_from_logits(logits, SamplingParams(1.0), _gen(5)) for _ in range(2)]
    assert torch.equal(seeded[0], seeded[1])
