"""Small dataclasses that the decode stages exchange (prefill -> propose -> verify -> commit)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dcoco.errors import DcocoError

IGNORE = -100  # label of slots that carry no loss (cross_entropy's ignore_index)


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next-token distribution is turned into tokens.

    temperature == 0 means greedy (argmax); top_k == 0 and top_p == 1 disable those filters.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise DcocoError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DcocoError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DcocoError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class TargetOutput:
    """One target forward over `tokens` new positions."""

    logits: Tensor  # [batch, tokens, vocab]
    features: Tensor | None  # [batch, tokens, taps * hidden]; tapped layer outputs, or None


@dataclass
class Proposal:
    """A drafted block: the tokens that follow the anchor (the last committed token)."""

    draft_tokens: Tensor  # [batch, slots] int64; slots may be 0 (plain decoding)
    # [batch, slots, vocab] the proposer's own distribution q, or None for a deterministic
    # proposal (a point mass on each draft token).
    draft_probs: Tensor | None = None
    # seconds of the proposal spent correcting/selecting after the drafter's pass (a draft head)
    correct_s: float = 0.0
    # seconds of one-off set-up inside this proposal (compiling a draft head on its first call),
    # counted in no cost: the draft-length policy would read them as what every draft costs
    setup_s: float = 0.0

    @property
    def num_slots(self) -> int:
        return self.draft_tokens.shape[1]


@dataclass
class Verdict:
    """What the target accepts of a proposal."""

    num_accepted: Tensor  # [batch] int64, in 0..slots
    next_token: Tensor  # [batch] int64: the corrected token on a miss, else the bonus token
