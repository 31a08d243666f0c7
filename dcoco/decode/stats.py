"""Per-request statistics recorded by the engine, and the metrics derived from them.

τ (acceptance length) counts the bonus/corrected token: a cycle that accepts n drafts emits n + 1
tokens, so plain decoding has τ = 1 and a block of `slots` drafts has τ ≤ slots + 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    accept_lengths: list[int] = field(default_factory=list)  # per cycle: accepted drafts + 1
    proposed_per_slot: list[int] = field(default_factory=list)  # slot i drafted in this many cycles
    reached_per_slot: list[int] = field(default_factory=list)  # ... with all earlier accepted
    accepted_per_slot: list[int] = field(default_factory=list)  # ... and accepted itself
    prefill_s: float = 0.0
    draft_s: float = 0.0  # the drafter's pass
    correct_s: float = 0.0  # a draft head's correction/selection after that pass
    verify_s: float = 0.0
    total_s: float = 0.0  # prefill to the last token, without setup_s
    setup_s: float = 0.0  # one-off set-up in the proposer (compiling a draft head), not timed

    def record_cycle(self, num_slots: int, num_accepted: int) -> None:
        self.accept_lengths.append(num_accepted + 1)
        grow = num_slots - len(self.proposed_per_slot)
        if grow > 0:
            for counts in (self.proposed_per_slot, self.reached_per_slot, self.accepted_per_slot):
                counts.extend([0] * grow)
        for slot in range(num_slots):
            self.proposed_per_slot[slot] += 1
            self.reached_per_slot[slot] += slot <= num_accepted
            self.accepted_per_slot[slot] += slot < num_accepted

    @property
    def cycles(self) -> int:
        return len(self.accept_lengths)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per verify cycle, bonus token included."""
        return sum(self.accept_lengths) / self.cycles if self.cycles else 0.0

    @property
    def other_s(self) -> float:
        """Host work: sampling, bookkeeping, detokenising callbacks."""
        spent = self.prefill_s + self.draft_s + self.correct_s + self.verify_s
        return max(0.0, self.total_s - spent)

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s

    @property
    def tokens_per_s(self) -> float:
        """End-to-end rate: new tokens over the whole request, prefill included."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def cycle_s(self) -> float:
        return self.decode_s / self.cycles if self.cycles else 0.0

    def accept_hist(self) -> dict[int, int]:
        """How many cycles emitted each number of tokens."""
        hist: dict[int, int] = {}
        for length in self.accept_lengths:
            hist[length] = hist.get(length, 0) + 1
        return dict(sorted(hist.items()))

    def per_position_acceptance(self) -> list[float]:
        """P(slot i accepted | slot i drafted); conditional on all earlier slots accepted."""
        return [
            accepted / reached if reached else 0.0
            for accepted, reached in zip(self.accepted_per_slot, self.reached_per_slot, strict=True)
        ]

    def summary(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "cycles": self.cycles,
            "tau": round(self.tau, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "cycle_ms": round(1000 * self.cycle_s, 3),
            "time_s": {
                "prefill": round(self.prefill_s, 4),
                "draft": round(self.draft_s, 4),
                "correct": round(self.correct_s, 4),
                "verify": round(self.verify_s, 4),
                "other": round(self.other_s, 4),
                "total": round(self.total_s, 4),
            },
            "accept_hist": self.accept_hist(),
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance()],
            # raw counts, so that acceptance can be pooled over requests (rates cannot be)
            "proposed_per_slot": list(self.proposed_per_slot),
            "reached_per_slot": list(self.reached_per_slot),
            "accepted_per_slot": list(self.accepted_per_slot),
        }
