"""Whether the DCOCO corrector pays at this cycle's draft length, measured while decoding.

The corrector re-picks a drafted block at a cost (0.3-0.9 ms a cycle on a 2-core CPU, by draft
length) where the drafter's own argmax costs nothing more, and what it gains depends on the
length: on held-out blocks +0.008 tokens a cycle at one slot, +6.7% at seven. So the engine asks
per cycle (`should_correct`) and learns from the cycles it corrects:

- At T = 0 a corrected cycle also tells what the argmax draft would have given. The target's
  tokens for the corrected draft's accepted prefix and the token after it are committed, so the
  argmax draft's acceptance is known up to there: exact where the two drafts part before the
  corrected one is rejected, a lower bound where the argmax matched every known token.
- Per draft length it keeps (decayed) sums of the corrected and the argmax tokens a cycle, the
  corrector's seconds and the cycle's (from one draft to the next, where no plain step ran
  between them), and corrects while
      (corrected + 1) / cycle  >=  (argmax + 1) / (cycle - correct)
  after MIN_CYCLES cycles at that length (until then it corrects).
- Off at a length, it still corrects every EXPLORE-th cycle there, so the gain is measured again.
Sampled cycles teach nothing (their committed tokens are draws, not the target's argmax). Either
draft is verified, so the output is the same with the gate on or off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torch import Tensor

MIN_CYCLES = 16  # corrected cycles at a length before the gate may switch the corrector off
EXPLORE = 8  # off at a length: every EXPLORE-th cycle there is corrected anyway
DECAY = 0.98  # weight of the older cycles at each new one (a window of ~50 cycles)


@dataclass
class Tally:
    """Decayed sums over the corrected cycles at one draft length."""

    weight: float = 0.0  # cycles
    corrected: float = 0.0  # drafts accepted
    argmax: float = 0.0  # drafts the argmax would have had accepted (a lower bound)
    correct_s: float = 0.0
    cycle_s: float = 0.0
    cycles: int = 0  # corrected cycles seen, undecayed
    skipped: int = 0  # cycles drafted uncorrected since the last corrected one

    def add(self, corrected: int, argmax: int, correct_s: float, cycle_s: float) -> None:
        self.weight = DECAY * self.weight + 1.0
        self.corrected = DECAY * self.corrected + corrected
        self.argmax = DECAY * self.argmax + argmax
        self.correct_s = DECAY * self.correct_s + correct_s
        self.cycle_s = DECAY * self.cycle_s + cycle_s
        self.cycles += 1

    def pays(self) -> bool:
        """Whether correcting drafts more tokens per second here than the argmax does."""
        if self.cycles < MIN_CYCLES:
            return True
        uncorrected_s = max(self.cycle_s - self.correct_s, 1e-9)
        corrected_rate = (self.corrected + self.weight) / self.cycle_s
        return corrected_rate >= (self.argmax + self.weight) / uncorrected_s


@dataclass
class _Drafted:
    """The last cycle's drafts, scored when the next cycle sees what was committed."""

    position: int  # where the drafts start in the token sequence (after the anchor)
    corrected: list[int]
    argmax: list[int]
    correct_s: float
    started: float  # perf_counter at the draft


@dataclass
class CorrectionGate:
    tallies: dict[int, Tally] = field(default_factory=dict)
    _pending: _Drafted | None = None

    def start(self) -> None:
        """A new request: the last one's drafts are not scored against it."""
        self._pending = None

    def should_correct(self, slots: int) -> bool:
        tally = self.tallies.setdefault(slots, Tally())
        if tally.pays():
            return True
        tally.skipped += 1
        return tally.skipped % EXPLORE == 0

    def drafted(self, tokens_so_far: int, corrected: list[int], argmax: list[int],
                correct_s: float, started: float) -> None:  # fmt: skip
        """A corrected greedy cycle's drafts, after `tokens_so_far` tokens, its pass begun at
        `started` (perf_counter): scored by the next `observe`."""
        self._pending = _Drafted(tokens_so_far, corrected, argmax, correct_s, started)

    def observe(self, tokens: Tensor) -> None:
        """Score the last corrected cycle against the tokens committed since (`tokens`: the
        sequence so far), timed from its draft to now; any other cycle is forgotten."""
        drafted, self._pending = self._pending, None
        if drafted is None or tokens.shape[0] <= drafted.position:
            return
        committed = tokens[drafted.position :].tolist()
        accepted = _common_prefix(drafted.corrected, committed)
        if len(committed) != accepted + 1:  # plain steps ran in between: not one cycle's time
            return
        known = committed[: accepted + 1]  # the accepted drafts and the target's next token
        argmax = min(_common_prefix(drafted.argmax, known), len(drafted.argmax))
        cycle_s = time.perf_counter() - drafted.started
        tally = self.tallies.setdefault(len(drafted.corrected), Tally())
        tally.add(accepted, argmax, drafted.correct_s, cycle_s)
        tally.skipped = 0


def _common_prefix(first: list[int], second: list[int]) -> int:
    count = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        count += 1
    return count
