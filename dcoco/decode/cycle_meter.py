"""Whole decode cycles as they run: what they cost and yield, for `--num-draft-tokens auto`.

The draft-length policy (dcoco.decode.draft_length) forecasts a cycle from its parts: the target's
cached cost curve (scaled by the verify forwards timed now), the proposer's timed pass and the
per-slot acceptance. A cycle also pays for what lies between them: sampling, the accept/reject
walk, the cache crop, the commit, the context-mode lookup, Python. On an Intel AMX Xeon the forecast
for `dflash` ran 50% high (122.7 tokens/s against 80.7 measured in the demo, issue 69), and auto
kept drafting at 0.95x plain. So the engine times every whole cycle, and:
- `overhead`: the time outside verify and draft, a running average for drafting and plain cycles
  apart, enters every forecast (the same code the engine runs, Python included);
- `RateMeter`: tokens per ms of whole cycles, plain ones (k = 0) and a mode's drafting ones, so a
  mode whose drafting cycles measure below plain's stops drafting (explorations re-measure it).
  A drafting cycle gives 1 to k + 1 tokens, so a few cycles' rate is noisy: in one demo run the
  1-gram and no-match modes of `dflash` stopped on such a streak although all their drafting
  cycles together ran 1.19x and 1.34x plain's rate. So a mode stops only where even its rate's
  upper bound (GUARD_Z standard errors of the tokens a cycle gave) is below plain's;
- `Ledger`: the tokens and ms forecast for the cycles that ran against what they gave, printed by
  `dcoco compare` (the demo) beside the measured speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RATE_DECAY = 0.9  # a rate meter's weight on its past (about the last 10 cycles count)
GUARD_CYCLES = 4  # timed cycles each side needs before measured drafting and plain are compared
GUARD_MARGIN = 0.97  # drafting stops where it measures below this share of plain's rate
GUARD_Z = 1.64  # ... by this many standard errors (one-sided 95%)


@dataclass
class RateMeter:
    """Tokens, their squares and milliseconds of whole cycles, each decayed by RATE_DECAY."""

    tokens: float = 0.0
    ms: float = 0.0
    cycles: int = 0
    squares: float = 0.0

    def add(self, tokens: int, ms: float) -> None:
        self.tokens = RATE_DECAY * self.tokens + tokens
        self.ms = RATE_DECAY * self.ms + ms
        self.squares = RATE_DECAY * self.squares + tokens * tokens
        self.cycles += 1

    @property
    def rate(self) -> float:
        """Tokens per ms (0 before any cycle)."""
        return self.tokens / self.ms if self.ms > 0 else 0.0

    def upper_rate(self, z: float = GUARD_Z) -> float:
        """The rate plus z standard errors of its mean tokens a cycle (over the decayed cycles'
        effective count), over its mean ms a cycle."""
        if self.ms <= 0:
            return 0.0
        # the cycles' weights: sum and sum of squares of RATE_DECAY^i, i < cycles
        weight = (1 - RATE_DECAY**self.cycles) / (1 - RATE_DECAY)
        weight_squares = (1 - RATE_DECAY ** (2 * self.cycles)) / (1 - RATE_DECAY**2)
        mean = self.tokens / weight
        variance = max(self.squares / weight - mean * mean, 0.0)
        effective = weight * weight / weight_squares
        return self.rate + z * (variance / effective) ** 0.5 / (self.ms / weight)

    @property
    def measured(self) -> bool:
        return self.cycles >= GUARD_CYCLES


@dataclass
class Overhead:
    """Milliseconds a cycle spends outside its verify forward and its proposer's pass, a running
    average for drafting cycles and plain ones apart (keyed by `drafting`; 0 until timed)."""

    mean_ms: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    cycles: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})

    def add(self, drafting: bool, ms: float) -> None:
        past = RATE_DECAY if self.cycles[drafting] else 0.0
        self.mean_ms[drafting] = past * self.mean_ms[drafting] + (1 - past) * max(ms, 0.0)
        self.cycles[drafting] += 1

    def ms(self, drafting: bool) -> float:
        """A cycle's overhead; a kind not timed yet borrows the other's."""
        return self.mean_ms[drafting if self.cycles[drafting] else not drafting]


@dataclass
class Ledger:
    """Forecast against measured, summed over the cycles that ran."""

    forecast_tokens: float = 0.0
    forecast_ms: float = 0.0
    tokens: int = 0
    ms: float = 0.0
    cycles: int = 0

    def add(self, forecast: tuple[float, float], tokens: int, ms: float) -> None:
        """One cycle: `forecast` (tokens, ms) made when its k was chosen, and what it gave."""
        self.forecast_tokens += forecast[0]
        self.forecast_ms += forecast[1]
        self.tokens += tokens
        self.ms += ms
        self.cycles += 1

    def describe(self) -> str:
        if not self.cycles or self.ms <= 0 or self.forecast_ms <= 0:
            return "no cycles timed"
        forecast = 1000 * self.forecast_tokens / self.forecast_ms
        measured = 1000 * self.tokens / self.ms
        return (
            f"forecast {forecast:.1f} tok/s, measured {measured:.1f} tok/s "
            f"({measured / forecast:.2f}x the forecast, {self.cycles} cycles)"
        )
