"""`dcoco bench-serve`: load a running OpenAI-compatible server (`dcoco serve`) at several
concurrency levels and report throughput, latency and speculative acceptance.

Standard library only (threads + urllib). Prompts come from the benchmark suites
(dcoco.eval.suites; first turns only). For each temperature x concurrency level, every prompt is
sent once by `concurrency` worker threads (closed loop). Output tokens are the server's
`usage.completion_tokens`; τ and per-position acceptance come from deltas of vLLM's Prometheus
counters on `/metrics` around the level (τ = 1 + Δaccepted / Δdrafts, the bonus token included).
Writes `<out>/bench_serve.json` and `<out>/throughput_vs_concurrency.png`; `--compare a.json,b.json`
only tabulates (summary.md) and draws several runs (one line per label and temperature).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from dcoco.config import add_config_args, config_from_args
from dcoco.errors import DcocoError
from dcoco.serving.bench_report import (
    compare_table,
    console_table,
    level_line,
    plot_throughput,
)

RESULT_FILE = "bench_serve.json"
PLOT_FILE = "throughput_vs_concurrency.png"
COMPARE_FILE = "summary.md"
SPEC_PREFIX = "vllm:spec_decode_num_"
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class BenchServeConfig:
    url: str = "http://127.0.0.1:8000"
    model: str = ""  # served model name; empty = the server's first model
    label: str = ""  # the method's name in the results and plots; empty = the model name
    suites: str = "gsm8k,humaneval,mtbench"  # all | comma-separated suite names
    data_dir: str = ""  # dir of <suite>.jsonl; empty = shared/data beside the repository
    prompts: str = ""  # one JSONL of suite records, used instead of --data-dir
    limit: int = 10  # prompts per suite (a fixed random sample); 0 = all
    concurrency: str = "1,4,8,16,32"  # comma-separated levels
    rounds: int = 2  # each level sends max(prompts, rounds x concurrency) requests (prompts cycled)
    temperatures: str = "0"  # comma-separated, e.g. 0,1
    max_tokens: int = 256
    timeout_s: float = 600.0  # per request
    warmup: bool = True  # one uncounted request before the first level
    out: str = ""  # output dir; empty = results/serve-<label>-<date>-<time>
    compare: str = ""  # comma-separated bench_serve.json files: only draw them in one plot
    plots: bool = True


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench-serve", help="throughput/latency/acceptance of a running server vs concurrency"
    )
    add_config_args(parser, BenchServeConfig)
    parser.set_defaults(handler=run)


def run(args) -> int:
    config = config_from_args(BenchServeConfig, args)
    if config.compare:
        files = [Path(p.strip()) for p in config.compare.split(",") if p.strip()]
        out = Path(config.out or "results/serve-compare")
        out.mkdir(parents=True, exist_ok=True)
        results = [json.loads(f.read_text()) for f in files]
        table = compare_table(results)
        (out / COMPARE_FILE).write_text(table + "\n")
        print(table)
        print(plot_throughput(results, out / PLOT_FILE) or "matplotlib is not installed")
        return 0
    result, out = run_bench_serve(config)
    print(console_table(result))
    print(f"results: {out}", file=sys.stderr)
    return 0


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


# --- HTTP ----------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8")


def served_model(base_url: str) -> str:
    models = json.loads(http_get(base_url + "/v1/models"))["data"]
    if not models:
        raise DcocoError(f"{base_url} serves no model")
    return models[0]["id"]


def chat_request(
    base_url: str, model: str, text: str, max_tokens: int, temperature: float, timeout: float
) -> dict:
    """One non-streaming chat completion -> a record (never raises on HTTP errors)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    request = urllib.request.Request(
        base_url + "/v1/chat/completions",
        data=json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            reply = json.loads(response.read().decode("utf-8"))
    except (urllib.error.URLError, TimeoutError, OSError, json.JSONDecodeError) as error:
        return {"ok": False, "error": str(error), "latency_s": time.perf_counter() - started}
    latency = time.perf_counter() - started
    usage = reply.get("usage") or {}
    spec = ((reply.get("metrics") or {}).get("speculative_decoding")) or {}
    choice = (reply.get("choices") or [{}])[0]
    return {
        "ok": True,
        "latency_s": latency,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "finish_reason": choice.get("finish_reason"),
        "tau": spec.get("mean_acceptance_length"),
    }


def run_level(
    base_url: str,
    model: str,
    texts: list[str],
    concurrency: int,
    max_tokens: int,
    temperature: float,
    timeout: float = 600.0,
) -> tuple[list[dict], float]:
    """Send every text once with `concurrency` requests in flight -> (records, wall seconds)."""
    lock = threading.Lock()
    records: list[dict] = []

    def one(text: str) -> None:
        record = chat_request(base_url, model, text, max_tokens, temperature, timeout)
        with lock:
            records.append(record)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, texts))
    return records, time.perf_counter() - started


# --- the command ---------------------------------------------------------------------------


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as error:
        raise DcocoError(f"--{what} must be comma-separated integers, got '{text}'") from error
    if not values or min(values) < 1:
        raise DcocoError(f"--{what} needs integers >= 1")
    return values


def _float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as error:
        raise DcocoError(f"--temperatures must be comma-separated numbers, got '{text}'") from error
    if not values or min(values) < 0:
        raise DcocoError("--temperatures needs numbers >= 0")
    return values


def run_bench_serve(config: BenchServeConfig) -> tuple[dict, Path]:
    from dcoco.eval.suites import load_prompts

    levels = _int_list(config.concurrency, "concurrency")
    temperatures = _float_list(config.temperatures)
    if config.max_tokens <= 0:
        raise DcocoError("--max-tokens must be > 0")
    prompts = load_prompts(config.data_dir, config.prompts, config.suites, config.limit)
    if not prompts:
        raise DcocoError("no prompts to send: the chosen suites are empty")
    texts = [prompt.turns[0] for prompt in prompts]
    base = config.url.rstrip("/")
    try:
        model = config.model or served_model(base)
    except (urllib.error.URLError, OSError) as error:
        raise DcocoError(f"no server at {base} ({error}): start one with `dcoco serve`") from error
    label = config.label or model
    out = Path(config.out or time.strftime(f"results/serve-{_slug(label)}-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    if config.warmup:
        chat_request(base, model, texts[0], min(16, config.max_tokens), 0.0, config.timeout_s)

    result = {
        "label": label,
        "url": base,
        "model": model,
        "config": asdict(config),
        "num_prompts": len(texts),
        "suites": sorted({prompt.suite for prompt in prompts}),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "levels": [],
    }
    for temperature in temperatures:
        for concurrency in levels:
            before = _counters(base)
            # enough requests that every stream stays busy: prompts are cycled to fill the level
            count = max(len(texts), config.rounds * concurrency)
            batch = [texts[i % len(texts)] for i in range(count)]
            records, wall = run_level(
                base, model, batch, concurrency, config.max_tokens, temperature, config.timeout_s
            )
            after = _counters(base)
            level = {"temperature": temperature, "concurrency": concurrency}
            level |= aggregate(records, wall)
            level["spec"] = spec_delta(before, after) if before and after else None
            result["levels"].append(level)
            print(level_line(label, level), file=sys.stderr)
            (out / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
    if config.plots:
        plot_throughput([result], out / PLOT_FILE)
    return result, out


def _counters(base: str) -> dict | None:
    try:
        return spec_counters(http_get(base + "/metrics"))
    except (urllib.error.URLError, OSError):
        return None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "server"
