"""Benchmark metrics: pure functions over `samples.jsonl` records (see dcoco.eval.samples).

Pooled quantities are computed from raw counts and seconds, never by averaging per-sample rates,
so a long answer weighs as much as its tokens; only `tau` is a per-sample mean (as DFlash
reports it). Definitions (report.md explains them to its readers too):

* τ (acceptance length): tokens emitted per verify cycle, the bonus/corrected token included
  (plain = 1). `tau` is the mean of per-sample τ, `tau_pooled` is Σ cycle lengths / Σ cycles.
* speedup: baseline time per token / method time per token, over the prompts both ran.
* match rate: at T = 0, the share of samples whose tokens equal the baseline's exactly.
* per-position acceptance: P(slot i accepted | slots < i accepted), Σ accepted_i / Σ reached_i.
* cycle split: draft / correct / verify / other (host) seconds over decode seconds (prefill
  excluded); `correct` is a draft head's time after the drafter's pass.
"""

from __future__ import annotations

from collections.abc import Iterable

from dcoco.eval.suites import CATEGORIES, SUITES

BASELINE = "plain"
CYCLE_PARTS = ("draft", "correct", "verify", "other")

MatchKey = tuple[str, str, int]  # suite, id, turn: the same prompt across methods


def temperature_key(temperature: float) -> str:
    return f"{float(temperature):g}"


def match_key(record: dict) -> MatchKey:
    return (record["suite"], record["id"], int(record["turn"]))


def accept_hist(records: Iterable[dict]) -> dict[int, int]:
    """Cycles per acceptance length (tokens emitted in the cycle), pooled over `records`."""
    hist: dict[int, int] = {}
    for record in records:
        for length, count in record["accept_hist"].items():  # JSON made the keys strings
            hist[int(length)] = hist.get(int(length), 0) + count
    return dict(sorted(hist.items()))


def _tau_of(hist: dict[int, int]) -> float | None:
    cycles = sum(hist.values())
    return sum(length * count for length, count in hist.items()) / cycles if cycles else None


def sample_tau(record: dict) -> float | None:
    """τ of one sample; None when it ran no cycle (it stopped on the prefill's token)."""
    return _tau_of(accept_hist([record]))


def mean_tau(records: list[dict]) -> float | None:
    taus = [tau for tau in map(sample_tau, records) if tau is not None]
    return sum(taus) / len(taus) if taus else None


def pooled_tau(records: list[dict]) -> float | None:
    return _tau_of(accept_hist(records))


def per_position(records: list[dict]) -> tuple[list[float | None], list[int]]:
    """Pooled conditional acceptance per draft slot, and how many cycles reached each slot."""
    accepted: list[int] = []
    reached: list[int] = []
    for record in records:
        for totals, counts in (
            (accepted, record["accepted_per_slot"]),
            (reached, record["reached_per_slot"]),
        ):
            totals.extend([0] * (len(counts) - len(totals)))
            for slot, count in enumerate(counts):
                totals[slot] += count
    # a slot no cycle reached has no rate (None), which is not the same as a rate of 0
    rates = [a / r if r else None for a, r in zip(accepted, reached, strict=True)]
    return rates, reached


def cycle_split(records: list[dict]) -> dict[str, float]:
    """Milliseconds per cycle, and the share of decode time, of draft / correct / verify /
    other."""
    cycles = sum(record["cycles"] for record in records)
    # records written before the correct stage was timed count it as 0
    seconds = {part: sum(r["time_s"].get(part, 0.0) for r in records) for part in CYCLE_PARTS}
    decode = sum(seconds.values())  # the parts make up all of the decode time
    ms_per_cycle = 1000 / cycles if cycles else 0.0
    split = {"cycle_ms": decode * ms_per_cycle}
    for part, value in seconds.items():
        split[f"{part}_ms"] = value * ms_per_cycle
        split[part] = value / decode if decode else 0.0
    return split


def time_per_token(records: list[dict]) -> float | None:
    """Seconds per new token over whole requests (prefill + decode), pooled."""
    tokens = sum(record["new_tokens"] for record in records)
    return sum(record["time_s"]["total"] for record in records) / tokens if tokens else None


def matched_pairs(records: list[dict], baseline: list[dict]) -> list[tuple[dict, dict]]:
    """(record, baseline record) for each prompt turn both ran."""
    by_key = {match_key(record): record for record in baseline}
    return [(r, by_key[match_key(r)]) for r in records if match_key(r) in by_key]


def speedup(records: list[dict], baseline: list[dict]) -> float | None:
    pairs = matched_pairs(records, baseline)
    method_tpt = time_per_token([record for record, _ in pairs])
    baseline_tpt = time_per_token([base for _, base in pairs])
    if not method_tpt or baseline_tpt is None:
        return None
    return baseline_tpt / method_tpt


def match_rate(records: list[dict], baseline: list[dict]) -> float | None:
    pairs = matched_pairs(records, baseline)
    if not pairs:
        return None
    return sum(record["new_ids"] == base["new_ids"] for record, base in pairs) / len(pairs)


def slice_metrics(records: list[dict], baseline: list[dict] | None, greedy: bool) -> dict:
    """Every metric of one method at one temperature over one slice of the prompts."""
    tpt = time_per_token(records)
    rates, reached = per_position(records)
    return {
        "samples": len(records),
        "new_tokens": sum(record["new_tokens"] for record in records),
        "cycles": sum(record["cycles"] for record in records),
        "tau": mean_tau(records),
        "tau_pooled": pooled_tau(records),
        "accept_hist": accept_hist(records),
        "per_position_acceptance": rates,
        "per_position_reached": reached,
        "cycle_split": cycle_split(records),
        "tokens_per_s": 1 / tpt if tpt else 0.0,
        "speedup": speedup(records, baseline) if baseline is not None else None,
        "match_rate": match_rate(records, baseline) if baseline is not None and greedy else None,
    }


def _ordered(values: Iterable) -> list:
    return list(dict.fromkeys(values))  # first-seen order, no duplicates


def summarize(records: list[dict], baseline: str = BASELINE) -> dict:
    """Per temperature, per method: metrics overall, per suite and per category."""
    methods = _ordered(record["method"] for record in records)
    temperatures = sorted({float(record["temperature"]) for record in records})
    # the canonical suite order, whatever order shards wrote them in; other suites after, as seen
    seen = _ordered(record["suite"] for record in records)
    suites = [s for s in SUITES if s in seen] + [s for s in seen if s not in SUITES]
    categories = [c for c in CATEGORIES if any(r["category"] == c for r in records)]
    results: dict[str, dict] = {}
    for temperature in temperatures:
        at_t = [r for r in records if float(r["temperature"]) == temperature]
        base = [r for r in at_t if r["method"] == baseline] if baseline in methods else None
        greedy = temperature == 0
        per_method = {}
        for method in methods:
            rows = [r for r in at_t if r["method"] == method]
            per_method[method] = {
                "overall": slice_metrics(rows, base, greedy),
                "suites": {
                    s: slice_metrics([r for r in rows if r["suite"] == s], base, greedy)
                    for s in suites
                },
                "categories": {
                    c: slice_metrics([r for r in rows if r["category"] == c], base, greedy)
                    for c in categories
                },
            }
        results[temperature_key(temperature)] = per_method
    return {
        "baseline": baseline if baseline in methods else None,
        "methods": methods,
        "temperatures": temperatures,
        "suites": suites,
        "categories": categories,
        "results": results,
    }
