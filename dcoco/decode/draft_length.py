"""`--num-draft-tokens auto`: each cycle, the draft length k that maximises expected tokens per
millisecond, from the target's measured cost curve and the method's per-slot acceptance.

With a_i the chance that slot i is accepted given slots 1..i-1 were, a cycle of k drafts commits
E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i tokens (the +1 is the corrected or bonus token) and costs
verify(k + 1) + draft. The a_i start from a prior (a drafter checkpoint's held-out slot accuracy,
which is the unconditional rate and so errs low, or a flat 0.5 for prompt lookup) and are updated
by the cycles this engine verifies, so a method whose drafts miss settles on short blocks. Any k is
lossless: it changes the speed, never the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dcoco.decode.cost_curve import CostCurve

FLAT_PRIOR = 0.5  # a_i for a method that stores no acceptance (prompt lookup)
PRIOR_WEIGHT = 8.0  # the prior counts as this many observed cycles per slot
DRAFT_COST_DECAY = 0.9  # the proposer's cost per cycle is a running average (weight of the past)


def expected_tokens(acceptance: list[float], k: int) -> float:
    """E(k): tokens committed by a cycle of k drafts with conditional acceptance a_1..a_k."""
    total, reach = 1.0, 1.0
    for rate in acceptance[:k]:
        reach *= rate
        total += reach
    return total


def best_draft_length(
    acceptance: list[float], curve: CostCurve, draft_ms: float, max_k: int
) -> int:
    """The k in 1..max_k with the most expected tokens per millisecond."""

    def rate(k: int) -> float:
        return expected_tokens(acceptance, k) / (curve.ms(k + 1) + draft_ms)

    return max(range(1, max_k + 1), key=rate)


@dataclass
class DraftLengthPolicy:
    curve: CostCurve
    max_k: int  # the most drafts the proposer can make
    prior: tuple[float, ...] = ()  # a_i per slot; slots beyond it get FLAT_PRIOR
    draft_ms: float = 0.0  # running average of the proposer's cost per cycle
    accepted: list[float] = field(init=False)  # per slot: cycles that accepted it (prior included)
    reached: list[float] = field(init=False)  # per slot: cycles that reached it (prior included)
    cycles: int = field(init=False, default=0)  # cycles observed

    def __post_init__(self):
        prior = [*self.prior[: self.max_k]]
        prior += [FLAT_PRIOR] * (self.max_k - len(prior))
        self.accepted = [PRIOR_WEIGHT * min(max(a, 0.01), 0.99) for a in prior]
        self.reached = [PRIOR_WEIGHT] * self.max_k

    def acceptance(self) -> list[float]:
        return [a / r for a, r in zip(self.accepted, self.reached, strict=True)]

    def choose(self) -> int:
        return best_draft_length(self.acceptance(), self.curve, self.draft_ms, self.max_k)

    def describe(self) -> str:
        rates = " ".join(f"{a:.2f}" for a in self.acceptance())
        return (
            f"k = {self.choose()} of {self.max_k} now (draft {self.draft_ms:.1f} ms/cycle; "
            f"slot acceptance {rates})"
        )

    def observe(self, proposed: int, accepted: int, draft_s: float) -> None:
        """A verified cycle: slots 1..accepted were accepted, slot accepted + 1 (when proposed)
        was missed."""
        for slot in range(min(accepted + 1, proposed)):
            self.reached[slot] += 1
            self.accepted[slot] += slot < accepted
        ms = draft_s * 1000
        past = DRAFT_COST_DECAY if self.cycles else 0.0
        self.draft_ms = past * self.draft_ms + (1 - past) * ms
        self.cycles += 1
