import pytest
import torch

from dcoco.contracts import Proposal, SamplingParams, Verdict
from dcoco.decode.sampling import logits_to_probs, sample
from dcoco.decode.verify import verify, verify_greedy, verify_point_mass, verify_with_draft_probs

ROWS = 20_000
# 99.9% quantile of chi-square with vocab - 1 = 5 degrees of freedom.
CHI2_LIMIT = 20.515
# Target law per block position (vocab 6, slots 2); position 2 gives the bonus token.
TARGET = torch.tensor(
    [
        [0.30, 0.25, 0.05, 0.10, 0.20, 0.10],
        [0.05, 0.30, 0.15, 0.35, 0.05, 0.10],
        [0.10, 0.10, 0.40, 0.10, 0.20, 0.10],
    ]
)
SLOTS, VOCAB = TARGET.shape[0] - 1, TARGET.shape[1]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logits_with_argmax(target_tokens: list[list[int]], vocab: int = 8) -> torch.Tensor:
    """[batch, slots + 1, vocab] logits whose argmax is `target_tokens`."""
    tokens = torch.tensor(target_tokens)
    return torch.nn.functional.one_hot(tokens, vocab).float() * 3.0


def _emitted(draft_tokens, verdict, position):
    """Tokens emitted at block `position`, over the rows whose earlier positions were drafts."""
    reached = verdict.num_accepted >= position  # [batch]
    padded = torch.cat([draft_tokens, verdict.next_token[:, None]], dim=1)  # [batch, slots + 1]
    tokens = torch.where(verdict.num_accepted > position, padded[:, position], verdict.next_token)
    return tokens[reached]


def _fit(tokens, target_probs):
    """(total variation, chi-square) of the empirical law of `tokens` against `target_probs`."""
    counts = torch.bincount(tokens, minlength=target_probs.numel()).double()
    expected = target_probs.double() * tokens.numel()
    tv = float((counts / tokens.numel() - target_probs.double()).abs().sum() / 2)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    return tv, chi2


def _violations(draft_tokens, verdict):
    """Every way the emitted tokens depart from TARGET; empty when the step is lossless."""
    found = []
    tv, _ = _fit(_emitted(draft_tokens, verdict, 0), TARGET[0])
    if tv >= 0.02:
        found.append(f"first token TV {tv:.4f}")
    for position in range(SLOTS + 1):
        tokens = _emitted(draft_tokens, verdict, position)
        assert tokens.numel() > 500, "too few rows reach this position to test it"
        _, chi2 = _fit(tokens, TARGET[position])
        if chi2 >= CHI2_LIMIT:
            found.append(f"position {position} chi-square {chi2:.1f}")
    return found


@pytest.mark.parametrize("drafts", [[4, 1], [0, 3]], ids=["non-argmax", "argmax"])
def test_point_mass_is_lossless(drafts):
    draft_tokens = torch.tensor(drafts).expand(ROWS, SLOTS)  # [batch, slots]
    verdict = verify_point_mass(draft_tokens, TARGET.expand(ROWS, -1, -1), _gen(1))
    assert _violations(draft_tokens, verdict) == []


def test_draft_probs_is_lossless():
    # Normalised exponentials are a Dirichlet(1, ..., 1) draw: a random q far from the target.
    exponentials = -torch.rand(SLOTS, VOCAB, generator=_gen(2)).log()
    draft_law = exponentials / exponentials.sum(-1, keepdim=True)  # [slots, vocab]
    draft_probs = draft_law.expand(ROWS, -1, -1)  # [batch, slots, vocab]
    draft_tokens = sample(draft_probs, _gen(3))  # [batch, slots]
    verdict = verify_with_draft_probs(
        draft_tokens, draft_probs, TARGET.expand(ROWS, -1, -1), _gen(4)
    )
    assert _violations(draft_tokens, verdict) == []


def test_dispatcher_samples_the_tempered_target():
    params = SamplingParams(temperature=0.8)
    logits = TARGET.log().expand(ROWS, -1, -1)  # [batch, slots + 1, vocab]
    proposal = Proposal(draft_tokens=torch.tensor([4, 1]).expand(ROWS, SLOTS))
    verdict = verify(proposal, logits, params, _gen(5))
    tv, _ = _fit(
        _emitted(proposal.draft_tokens, verdict, 0), logits_to_probs(TARGET[0].log(), params)
    )
    assert tv < 0.02


def _always_accept(draft_tokens, target_probs, generator):
    slots = draft_tokens.shape[1]
    bonus_token = sample(target_probs[:, slots], generator)
    return Verdict(torch.full_like(bonus_token, slots), bonus_token)


def _correct_from_target(draft_tokens, target_probs, generator):
    # Forgets to remove the rejected draft token from the correction distribution.
    verdict = verify_point_mass(draft_tokens, target_probs, generator)
    index = verdict.num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    redrawn = sample(target_probs.gather(1, index).squeeze(1), generator)
    corrected_token = torch.where(verdict.num_accepted < SLOTS, redrawn, verdict.next_token)
    return Verdict(verdict.num_accepted, corrected_token)


@pytest.mark.parametrize("wrong_rule", [_always_accept, _correct_from_target])
def test_negative_control_wrong_rules_fail_the_check(wrong_rule):
    draft_tokens = torch.tensor([4, 1]).expand(ROWS, SLOTS)
    verdict = wrong_rule(draft_tokens, TARGET.expand(ROWS, -1, -1), _gen(6))
    found = _violations(draft_tokens, verdict)
    assert any(v.startswith("first token TV") for v in found), found


def test_greedy_all_accepted_gives_bonus_from_last_position():
    verdict = verify_greedy(torch.tensor([[2, 5, 1]]), _logits_with_argmax([[2, 5, 1, 7]]))
    assert verdict.num_accepted.tolist() == [3] and verdict.next_token.tolist() == [7]


def test_greedy_first_slot_wrong():
    # Later slots that happen to match must not count after a miss.
    verdict = verify_greedy(torch.tensor([[4, 5, 1]]), _logits_with_argmax([[2, 5, 1, 7]]))
    assert verdict.num_accepted.tolist() == [0] and verdict.next_token.tolist() == [2]


def test_greedy_rows_accept_independently():
    drafts = torch.tensor([[2, 5, 1], [2, 6, 1], [2, 5, 0], [3, 5, 1]])
    verdict = verify_greedy(drafts, _logits_with_argmax([[2, 5, 1, 7]] * 4))
    assert verdict.num_accepted.dtype == torch.int64
    assert verdict.num_accepted.tolist() == [3, 1, 2, 0]
    assert verdict.next_token.tolist() == [7, 5, 1, 2]


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(1.0, top_k=1)])
def test_zero_slots_is_plain_decoding(params):
    proposal = Proposal(draft_tokens=torch.zeros(2, 0, dtype=torch.int64))
    verdict = verify(proposal, _logits_with_argmax([[3], [6]]), params, _gen())
    assert verdict.num_accepted.tolist() == [0, 0] and verdict.next_token.tolist() == [3, 6]


def test_greedy_dispatch_ignores_draft_probs():
    drafts = torch.tensor([[2, 6]])
    proposal = Proposal(draft_tokens=drafts, draft_probs=torch.zeros(1, 2, 8))
    verdict = verify(proposal, _logits_with_argmax([[2, 5, 1]]), SamplingParams(0.0))
    assert verdict.num_accepted.tolist() == [1] and verdict.next_token.tolist() == [5]


def test_point_mass_certain_and_impossible_drafts():
    target_probs = torch.nn.functional.one_hot(torch.tensor([[2, 5, 1]]), 8).float()
    sure = verify_point_mass(torch.tensor([[2, 5]]), target_probs, _gen())
    assert sure.num_accepted.tolist() == [2] and sure.next_token.tolist() == [1]
    missed = verify_point_mass(torch.tensor([[2, 4]]), target_probs, _gen())
    assert missed.num_accepted.tolist() == [1] and missed.next_token.tolist() == [5]


def test_empty_residual_falls_back_to_target():
    target_probs = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]]).expand(1000, -1, -1)
    # An unnormalised q at or above the target everywhere leaves no residual mass on a miss.
    draft_probs = torch.tensor([[[1.0, 1.0, 0.0, 0.0]]]).expand(1000, -1, -1)
    drafts = torch.zeros(1000, 1, dtype=torch.int64)
    verdict = verify_with_draft_probs(drafts, draft_probs, target_probs, _gen(7))
    missed = verdict.num_accepted == 0
    assert 0 < int(missed.sum()) < 1000
    assert set(verdict.next_token[missed].tolist()) <= {0, 1}
    assert (verdict.next_token[~missed] == 2).all()


def test_same_seed_same_verdict():
    drafts = torch.tensor([4, 1]).expand(64, SLOTS)
    first, second = (verify_point_mass(drafts, TARGET.expand(64, -1, -1), _gen(8)) for _ in "ab")
    assert torch.equal(first.num_accepted, second.num_accepted)
    assert torch.equal(first.next_token, second.next_token)


def test_shape_errors():
    logits = torch.zeros(2, 3, 8)
    with pytest.raises(ValueError, match="int64"):
        verify_greedy(torch.zeros(2, 2), logits)
    with pytest.raises(ValueError, match="slots \\+ 1"):
        verify_greedy(torch.zeros(2, 3, dtype=torch.int64), logits)
    with pytest.raises(ValueError, match="slots \\+ 1"):
        verify_point_mass(torch.zeros(3, 2, dtype=torch.int64), logits)
    with pytest.raises(ValueError, match="draft_probs"):
        verify_with_draft_probs(torch.zeros(2, 2, dtype=torch.int64), torch.zeros(2, 2, 7), logits)
