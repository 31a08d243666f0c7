"""From the schedule probe's measurements to a draft schedule (dcoco.serving.draft_schedule).

The probe (dcoco.serving.vllm_schedule_probe) times a step at a few draft lengths K per batch
size b and measures how often each draft position is accepted. A step's time grows about
linearly with K at a given b (the verify's rows are b x (K + 1)), so the lengths in between are
interpolated: the probe runs one engine per measured K (4 for K up to 7, not 8), and the schedule
may still pick any K. Each b then gets the shortest K whose predicted tokens/s,
b x τ(K) / step(b, K) with τ(K) = 1 + the first K positions' acceptance, is within TOLERANCE of
its fastest.
"""

from __future__ import annotations

from dcoco.errors import DcocoError
from dcoco.serving.draft_schedule import (
    OPEN_END,
    Schedule,
    at_most,
    format_schedule,
    merged_ranges,
    with_ceiling,
)
from dcoco.serving.head_ceiling import choose_ceiling, merged_rates

TOLERANCE = 0.02  # a shorter K within this share of the fastest wins (cheaper, as fast)

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
    """(`GREEDY/SAMPLED[@N]`, the predicted {T: {K: {batch: tokens/s}}} it was chosen from) of the
    probe's measurements; for a head method, N and the greedy schedule beyond N come from the
    cells timed without the head (`head_off`)."""
    step_s, acceptance = summary["step_s"], summary["acceptance"]
    rates = {t: predicted_rates(interpolated(step_s[t]), acceptance[t]) for t in ("0", "1")}
    greedy_rates, ceiling = _by_batch(rates["0"]), OPEN_END
    if summary.get("head_off"):
        off = summary["head_off"]  # K > 0 only: at K = 0 the head has nothing to pick
        off_steps = interpolated({"0": step_s["0"]["0"], **off["step_s"]})
        rates["0 without head"] = predicted_rates(off_steps, off["acceptance"])
        without = _by_batch(rates["0 without head"])
        ceiling = choose_ceiling(greedy_rates, without)
        greedy_rates = merged_rates(greedy_rates, without, ceiling)
    greedy, sampled = choose(greedy_rates), choose(_by_batch(rates["1"]))
    pair = f"{format_schedule(greedy)}/{format_schedule(at_most(sampled, greedy))}"
    return with_ceiling(pair, ceiling), rates


def interpolated(step_s: Steps) -> Steps:
    """Every K from the shortest to the longest measured: a K between two measured ones gets, per
    batch size both measured, the straight line between their step times."""
    measured = sorted(int(k) for k in step_s)
    out = {}
    for low, high in zip(measured, measured[1:], strict=False):
        below, above = step_s[str(low)], step_s[str(high)]
        for k in range(low + 1, high):
            share = (k - low) / (high - low)
            out[str(k)] = {
                b: round(below[b] + share * (above[b] - below[b]), 6) for b in below if b in above
            }
    return {str(k): step_s.get(str(k)) or out[str(k)] for k in range(measured[0], measured[-1] + 1)}


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
