"""`--num-draft-tokens auto`: each cycle, the draft length k that maximises expected tokens per
millisecond, from the target's measured cost curve and the method's per-slot acceptance; k = 0
(a plain step, no proposer pass) where no draft pays, e.g. sampled replies on a CPU whose verify
grows fast with its length.

With a_i the chance that slot i is accepted given slots 1..i-1 were, a cycle of k drafts commits
E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i tokens (the +1 is the corrected or bonus token) and costs
verify(k + 1) + draft; k = 0 commits 1 token for verify(1). The a_i start from a prior (a
drafter checkpoint's held-out slot accuracy, which is the unconditional rate and so errs low, or
a flat 0.5 for prompt lookup) and are updated by the cycles this engine verifies, so a method
whose drafts miss settles on short blocks or none.
The curve is measured once per machine and cached, so it goes stale when the machine's speed moves
(a VM whose neighbours got busier or quieter: on the Xeon a step(1) cached at 19.8 ms ran at 14.2
in a later session). The engine times each cycle's verify forward; the median ratio of those
times to the curve's over the last VERIFY_WINDOW cycles scales the whole curve (`curve_scale`),
so k follows what a verify costs now, not what it cost when the curve was cached.
A context mode that has drafted nothing for EXPLORE_EVERY cycles drafts once (the best k >= 1), so
its rates keep following the text; each exploration that leaves the mode still not drafting doubles
the wait before the next (up to MAX_EXPLORE_EVERY), and a mode that drafts again starts over. So
sampled replies, whose drafts rarely pay on a CPU, stop paying for explorations every 9th cycle
(about 1% of their speed in the ten-suite run at T = 1); and no sooner than its pass costs
EXPLORE_BUDGET of the plain steps it waited (a proposer as slow as 10 steps waits 500).
The engine also times each whole cycle (dcoco.decode.cycle_meter): what a cycle spends outside
its verify and draft enters the forecast, and a mode whose drafting cycles measure below plain's
tokens/s drafts nothing until an exploration measures it faster again. Any k is lossless: it
changes the speed, never the output.

The a_i and the draft cost are kept per *context mode* (ContextMode): the length of the n-gram
ending at the anchor that occurred earlier in the context
(dcoco.models.drafter.copy_hints.match_length;
0 = none), the same key for every method, and the request's sampling setting. Where the text
repeats itself a draft is accepted far more often and further (a loop, a quoted line), and for
`pld-dflash` a lookup cycle costs no drafter pass; one pooled rate would cut those cycles as short
as the others (issue 16: on AVX2 in fp32 it held the copy-hint drafter to 4 drafts while prompt
lookup's loops ran to 7). A sampled draft is accepted with the target's probability of it, far
less often than a greedy one: an engine that serves both (the bench alternates T = 0 and T = 1
prompt by prompt) would otherwise over-draft the sampled replies and under-draft the greedy ones.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from dcoco.contracts import SamplingParams
from dcoco.decode.cost_curve import CostCurve
from dcoco.decode.cycle_meter import GUARD_MARGIN, Ledger, Overhead, RateMeter

FLAT_PRIOR = 0.5  # a_i for a method that stores no acceptance (prompt lookup)
PRIOR_WEIGHT = 8.0  # the prior counts as this many observed cycles per slot
DRAFT_COST_DECAY = 0.9  # the proposer's cost per cycle is a running average (weight of the past)
EXPLORE_EVERY = 8  # cycles without drafts in a mode before it drafts once to re-measure
MAX_EXPLORE_EVERY = 64  # the longest wait that back-off reaches
EXPLORE_BUDGET = 0.02  # an exploration waits until its pass costs at most this share of the wait
VERIFY_WINDOW = 16  # verify forwards whose median ratio to the curve scales it
VERIFY_MIN = 3  # verify forwards timed before the scale moves from 1 (a median needs a few)


class ContextMode(NamedTuple):
    """The key a policy keeps its rates under."""

    match: int = 0  # the n-gram match length at the anchor (0 = none)
    sampling: SamplingParams | None = None  # a sampled request's setting; None: greedy


Mode = int | ContextMode  # an int: the match length of a greedy request


def expected_tokens(acceptance: list[float], k: int) -> float:
    """E(k): tokens committed by a cycle of k drafts with conditional acceptance a_1..a_k."""
    total, reach = 1.0, 1.0
    for rate in acceptance[:k]:
        reach *= rate
        total += reach
    return total


def best_draft_length(
    acceptance: list[float],
    curve: CostCurve,
    draft_ms: float,
    max_k: int,
    min_k: int = 1,
    scale: float = 1.0,
    overhead: Overhead | None = None,
) -> int:
    """The k in min_k..max_k with the most expected tokens per millisecond (k = 0: a plain step,
    no proposer pass; the cheaper k on a tie), each verify costing `scale` times the curve's and
    each cycle its `overhead` beside (dcoco.decode.cycle_meter)."""

    def rate(k: int) -> float:
        tokens, ms = cycle_forecast(acceptance, curve, draft_ms, k, scale, overhead)
        return tokens / ms

    return max(range(min_k, max_k + 1), key=rate)


def cycle_forecast(
    acceptance: list[float],
    curve: CostCurve,
    draft_ms: float,
    k: int,
    scale: float = 1.0,
    overhead: Overhead | None = None,
) -> tuple[float, float]:
    """(tokens, ms) a cycle of k drafts is expected to commit and cost."""
    extra = overhead.ms(k > 0) if overhead else 0.0
    if k == 0:
        return 1.0, scale * curve.ms(1) + extra
    return expected_tokens(acceptance, k), scale * curve.ms(k + 1) + draft_ms + extra


@dataclass
class ModeCounts:
    """Per-slot counts of one context mode, the prior included."""

    accepted: list[float]  # per slot: cycles that accepted it
    reached: list[float]  # per slot: cycles that reached it
    draft_ms: float  # running average of the proposer's cost per cycle
    cycles: int = 0  # verified cycles, those without drafts included
    drafted: int = 0  # cycles with drafts
    idle: int = 0  # cycles without drafts since the last one with
    explore_every: int = EXPLORE_EVERY  # the idle cycles before the next exploration
    drafting: RateMeter = field(default_factory=RateMeter)  # whole cycles with drafts, timed


@dataclass
class DraftLengthPolicy:
    curve: CostCurve
    max_k: int  # the most drafts the proposer can make
    prior: tuple[float, ...] = ()  # a_i per slot; slots beyond it get FLAT_PRIOR
    draft_ms: float = 0.0  # the proposer's cost per cycle before a mode has timed its own
    modes: dict[ContextMode, ModeCounts] = field(init=False, default_factory=dict)
    # timed verify ms / the curve's ms for as many tokens, the last VERIFY_WINDOW cycles'
    verify_ratios: deque = field(init=False, default_factory=lambda: deque(maxlen=VERIFY_WINDOW))
    # whole cycles as they ran (dcoco.decode.cycle_meter): plain ones, every mode's; the time
    # outside verify and draft; the forecast of the cycles that ran against what they gave
    plain: RateMeter = field(init=False, default_factory=RateMeter)
    overhead: Overhead = field(init=False, default_factory=Overhead)
    ledger: Ledger = field(init=False, default_factory=Ledger)
    _forecast: tuple[float, float] | None = field(init=False, default=None)  # the next cycle's
    # the proposer's latest cost in a mode with an n-gram match and without (True/False): a mode
    # seen for the first time starts from it, not from `draft_ms`, so a slow proposer is not
    # paid again to learn its cost in every new mode (a prompt-lookup cycle, where there is a
    # match, can cost far less than a drafter's: the two are kept apart)
    _latest_ms: dict[bool, float] = field(init=False, default_factory=dict)
    _asked: int = field(init=False, default=0)  # the k next_length gave the cycle being run

    @property
    def curve_scale(self) -> float:
        """What a verify costs now against the cached curve: the median ratio (1 until
        VERIFY_MIN forwards were timed; a median, so one slow first call does not move it)."""
        if len(self.verify_ratios) < VERIFY_MIN:
            return 1.0
        return statistics.median(self.verify_ratios)

    @property
    def cycles(self) -> int:
        """Cycles observed, every mode."""
        return sum(counts.cycles for counts in self.modes.values())

    def counts(self, mode: Mode = 0) -> ModeCounts:
        mode = _as_mode(mode)
        if mode not in self.modes:
            prior = [*self.prior[: self.max_k]]
            prior += [FLAT_PRIOR] * (self.max_k - len(prior))
            accepted = [PRIOR_WEIGHT * min(max(a, 0.01), 0.99) for a in prior]
            draft_ms = self._latest_ms.get(mode.match > 0, self.draft_ms)
            self.modes[mode] = ModeCounts(accepted, [PRIOR_WEIGHT] * self.max_k, draft_ms)
        return self.modes[mode]

    def acceptance(self, mode: Mode = 0) -> list[float]:
        counts = self.counts(mode)
        return [a / r for a, r in zip(counts.accepted, counts.reached, strict=True)]

    def choose(self, mode: Mode = 0) -> int:
        """The best k in 0..max_k for `mode` now (no side effects): 0 where the mode's drafting
        cycles measured below plain's whatever the forecast says."""
        if self.below_plain(mode):
            return 0
        return self._best(mode, 0)

    def _best(self, mode: Mode, min_k: int) -> int:
        counts, acceptance, scale = self.counts(mode), self.acceptance(mode), self.curve_scale
        return best_draft_length(acceptance, self.curve, counts.draft_ms, self.max_k, min_k,
                                 scale, self.overhead)  # fmt: skip

    def below_plain(self, mode: Mode = 0) -> bool:
        """Whether even the upper bound of `mode`'s drafting rate (RateMeter.upper_rate) is below
        GUARD_MARGIN x plain's tokens/ms (measured where enough plain cycles ran, else forecast)."""
        drafting = self.counts(mode).drafting
        if not drafting.measured:
            return False
        return drafting.upper_rate() < GUARD_MARGIN * self.plain_rate()

    def plain_rate(self) -> float:
        """Plain's tokens per ms: measured, else the forecast of a k = 0 cycle, with an overhead
        only where plain cycles timed one (a drafting cycle's may be what makes drafting slow;
        once the guard has stopped drafting, plain cycles are measured)."""
        if self.plain.measured:
            return self.plain.rate
        overhead = self.overhead if self.overhead.cycles[False] else None
        tokens, ms = cycle_forecast([], self.curve, 0.0, 0, self.curve_scale, overhead)
        return tokens / ms

    def forecast(self, mode: Mode, k: int) -> tuple[float, float]:
        """(tokens, ms) of a cycle of k drafts in `mode` now."""
        counts, acceptance, scale = self.counts(mode), self.acceptance(mode), self.curve_scale
        return cycle_forecast(acceptance, self.curve, counts.draft_ms, k, scale, self.overhead)

    def next_length(self, mode: Mode = 0) -> int:
        """The k of the next cycle: `choose`, except that after `explore_every` cycles without
        drafts the mode drafts once, with the best k >= 1 (the wait doubles from one exploration
        to the next while `choose` stays at 0)."""
        k = self._asked = self._next(mode)
        self._forecast = self.forecast(mode, k)
        return k

    def _next(self, mode: Mode) -> int:
        counts = self.counts(mode)
        k = self.choose(mode)
        if k > 0:
            counts.idle, counts.explore_every = 0, EXPLORE_EVERY
            return k
        counts.idle += 1
        # an exploration's pass costs at most EXPLORE_BUDGET of the plain steps it waited for
        affordable = counts.draft_ms * self.plain_rate() / EXPLORE_BUDGET
        if counts.idle < max(counts.explore_every, affordable):
            return 0
        counts.idle = 0
        counts.explore_every = min(2 * counts.explore_every, MAX_EXPLORE_EVERY)
        return self._best(mode, 1)

    def describe(self) -> str:
        if not self.modes:
            return f"k = {self.choose()} of {self.max_k} now (nothing verified yet)"
        scale = f"verify {self.curve_scale:.2f}x the cached curve; "
        parts = []
        for mode in sorted(self.modes, key=lambda m: (m.sampling is None, m.match), reverse=True):
            rates = " ".join(f"{a:.2f}" for a in self.acceptance(mode))
            parts.append(
                f"{_mode_name(mode)}: k = {self.choose(mode)} (draft "
                f"{self.modes[mode].draft_ms:.1f} ms; slot acceptance {rates}"
                f"{'; measured below plain' if self.below_plain(mode) else ''})"
            )
        overhead = (f"outside verify and draft {self.overhead.ms(True):.1f} ms a drafting cycle, "
                    f"{self.overhead.ms(False):.1f} ms a plain one; ")  # fmt: skip
        return f"of {self.max_k} now; {scale}{overhead}" + "; ".join(parts)

    def observe(
        self,
        proposed: int,
        accepted: int,
        draft_s: float,
        mode: Mode = 0,
        verify_s: float | None = None,
        cycle_s: float | None = None,
    ) -> None:
        """A verified cycle in context `mode`: slots 1..accepted were accepted, slot
        accepted + 1 (when proposed) was missed; its verify forward over proposed + 1 tokens
        took `verify_s` and the whole cycle, choice to commit, `cycle_s` (None: not timed)."""
        counts, asked, self._asked = self.counts(mode), self._asked, 0
        counts.cycles += 1
        if verify_s is not None and verify_s > 0:
            self.verify_ratios.append(verify_s * 1000 / self.curve.ms(proposed + 1))
        if cycle_s is not None:
            passed = proposed > 0 or asked > 0  # a pass that found nothing to draft cost too
            self._observe_cycle(counts, passed, accepted + 1, draft_s, verify_s, cycle_s)
        if proposed == 0 and asked == 0:  # a plain step: no acceptance to learn, no pass
            return
        for slot in range(min(accepted + 1, proposed)):
            counts.reached[slot] += 1
            counts.accepted[slot] += slot < accepted
        ms = draft_s * 1000
        past = DRAFT_COST_DECAY if counts.drafted else 0.0
        counts.draft_ms = past * counts.draft_ms + (1 - past) * ms
        counts.drafted += 1
        self._latest_ms[_as_mode(mode).match > 0] = counts.draft_ms

    def _observe_cycle(self, counts, drafting, tokens, draft_s, verify_s, cycle_s) -> None:
        """A whole timed cycle (`drafting`: the proposer ran): its overhead, its kind's rate,
        its forecast against it."""
        cycle_ms = cycle_s * 1000
        if verify_s is not None:
            self.overhead.add(drafting, cycle_ms - 1000 * (verify_s + draft_s))
        (counts.drafting if drafting else self.plain).add(tokens, cycle_ms)
        if self._forecast is not None:
            self.ledger.add(self._forecast, tokens, cycle_ms)
            self._forecast = None


def _as_mode(mode: Mode) -> ContextMode:
    return mode if isinstance(mode, ContextMode) else ContextMode(mode)


def _mode_name(mode: ContextMode) -> str:
    name = f"{mode.match}-gram match" if mode.match else "no match"
    sampling = mode.sampling
    return name if sampling is None else f"T={sampling.temperature:g}, {name}"
