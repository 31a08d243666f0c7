"""What `dcoco bench-serve` computes from a server's answers: vLLM's Prometheus counters on
`/metrics` (τ and per-position acceptance from their deltas around a level) and the aggregate
throughput and latency of a level's requests. Pure functions, no HTTP."""

from __future__ import annotations

import re

SPEC_PREFIX = "vllm:spec_decode_num_"
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# --- /metrics --------------------------------------------------------------------------------


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition -> (name, labels, value) samples; comments skipped."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(match.group(3) or ""))
        samples.append((match.group(1), labels, value))
    return samples


def spec_counters(text: str) -> dict:
    """vLLM's speculative-decoding counters, summed over engines and models.

    {"drafts", "draft_tokens", "accepted_tokens": float, "per_position": [float, ...]}
    """
    counters = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    per_position: dict[int, float] = {}
    for name, labels, value in parse_metrics(text):
        if not name.startswith(SPEC_PREFIX) or not name.endswith("_total"):
            continue
        key = name[len(SPEC_PREFIX) : -len("_total")]
        if key == "accepted_tokens_per_pos":
            position = int(labels.get("position", 0))
            per_position[position] = per_position.get(position, 0.0) + value
        elif key in counters:
            counters[key] += value
    size = max(per_position) + 1 if per_position else 0
    counters["per_position"] = [per_position.get(i, 0.0) for i in range(size)]
    return counters


def spec_delta(before: dict, after: dict) -> dict:
    """Acceptance over the requests between two `spec_counters` snapshots."""
    drafts = after["drafts"] - before["drafts"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    size = max(len(before["per_position"]), len(after["per_position"]))
    old = before["per_position"] + [0.0] * (size - len(before["per_position"]))
    new = after["per_position"] + [0.0] * (size - len(after["per_position"]))
    per_position = [b - a for a, b in zip(old, new, strict=True)]
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "tau": 1.0 + accepted / drafts if drafts > 0 else None,
        "acceptance_rate": accepted / draft_tokens if draft_tokens > 0 else None,
        # P(slot i accepted) per draft, vLLM's definition
        "per_position": [x / drafts for x in per_position] if drafts > 0 else [],
        # P(slot i accepted | slot i - 1 accepted), our engine's definition
        "per_position_conditional": [
            x / reached if reached > 0 else 0.0
            for x, reached in zip(per_position, [drafts, *per_position], strict=False)
        ]
        if drafts > 0
        else [],
    }


# --- aggregation ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def aggregate(records: list[dict], wall_s: float) -> dict:
    """One level's summary from its request records ({ok, latency_s, completion_tokens, ...})."""
    ok = [r for r in records if r.get("ok")]
    latencies = [r["latency_s"] for r in ok]
    tokens = sum(r.get("completion_tokens", 0) for r in ok)
    per_request_tau = [r["tau"] for r in ok if r.get("tau") is not None]
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "wall_s": round(wall_s, 4),
        "output_tokens": tokens,
        "output_tok_s": tokens / wall_s if wall_s > 0 else 0.0,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "latency_s": {
            "mean": sum(latencies) / len(latencies) if latencies else None,
            "p50": percentile(latencies, 50),
            "p90": percentile(latencies, 90),
            "p99": percentile(latencies, 99),
        },
        "per_request_tau_mean": (
            sum(per_request_tau) / len(per_request_tau) if per_request_tau else None
        ),
    }
