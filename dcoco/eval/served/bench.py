"""`dcoco bench-serve`: load a running OpenAI-compatible server (`dcoco serve`) at several
concurrency levels and report throughput, latency and speculative acceptance.

Standard library only (threads + urllib; counters and aggregates: dcoco.eval.served.metrics).
Prompts come from the benchmark suites (dcoco.eval.suites; first turns only). For each temperature
x concurrency level, every prompt is sent once by `concurrency` worker threads (closed loop).
Output tokens are the server's `usage.completion_tokens`; τ and per-position acceptance come from
deltas of vLLM's Prometheus counters on `/metrics` around the level (τ = 1 + Δaccepted / Δdrafts,
the bonus token included). Writes `<out>/bench_serve.json` and a figure; `--compare a.json,...`
only tabulates (summary.md; a label repeated across runs is a server started again) and draws
runs; `--servers LABEL=URL,...` loads several running servers in turn at every level, each into
`<out>/<label>/`, and tabulates them (dcoco.eval.served.interleave says why).
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

from dcoco.config import Command
from dcoco.errors import DcocoError
from dcoco.eval.run_record import write_run_record
from dcoco.eval.served.interleave import level_turns, parse_servers, turn_order
from dcoco.eval.served.metrics import aggregate, spec_counters, spec_delta
from dcoco.eval.served.report import (
    compare_table,
    console_table,
    level_line,
    margin_table,
    numbered,
    plot_throughput,
    pooled,
    ratio_table,
    spread_table,
)
from dcoco.eval.suites import load_prompts
from dcoco.paths import portable_record

RESULT_FILE = "bench_serve.json"
PLOT_FILE = "throughput_vs_concurrency.png"
COMPARE_FILE = "summary.md"


@dataclass
class BenchServeConfig:
    url: str = "http://127.0.0.1:8000"  # the server's base URL
    model: str = ""  # served model name; empty = the server's first model
    label: str = ""  # the method's name in the results and plots; empty = the model name
    suites: str = "gsm8k,humaneval,mtbench"  # all | comma-separated suite names
    data_dir: str = ""  # dir of <suite>.jsonl; empty = shared/data beside the repository
    prompts: str = ""  # one JSONL of suite records, used instead of --data-dir
    limit: int = 10  # prompts per suite (a fixed random sample); 0 = all
    concurrency: tuple[int, ...] = (1, 4, 8, 16, 32)  # concurrent streams, one level each
    rounds: int = 2  # each level sends max(prompts, rounds x concurrency) requests (prompts cycled)
    temperatures: tuple[float, ...] = (0.0,)  # every level is run at each, e.g. 0,1
    max_tokens: int = 256  # reply length, at most
    timeout_s: float = 600.0  # per request
    warmup: bool = True  # one uncounted request before the first level
    out: str = ""  # output dir; empty = results/serve-<label>-<date>-<time>
    compare: tuple[str, ...] = ()  # bench_serve.json files: only tabulate and draw them, no load
    servers: tuple[str, ...] = ()  # LABEL=URL,...: load these in turn per level (not --url)
    turns: int = 1  # each level's requests in this many equal turns per server, servers alternated
    plots: bool = True  # draw throughput_vs_concurrency.png (needs matplotlib)


def run(config: BenchServeConfig) -> int:
    if config.compare:
        out = Path(config.out or "results/serve-compare")
        write_compare([json.loads(Path(p).read_text()) for p in config.compare], out)
        return 0
    if config.servers:
        results, out = run_interleaved(config)
        for result in results:
            write_run_record(out / slug(result["label"]), "bench-serve", config)
        write_compare(results, out)
        return 0
    result, out = run_bench_serve(config)
    write_run_record(out, "bench-serve", config)
    print(console_table(result))
    print(f"results: {out}", file=sys.stderr)
    return 0


def write_compare(results: list[dict], out: Path) -> None:
    """summary.md (tokens/s, ratios to plain, DCOCO's margin, latency) and one figure in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    results = numbered(results)
    sections = [
        "## Output tokens/s\n\n" + compare_table(results),
        "## Against plain (same T, same level)\n\n" + ratio_table(results),
        "## DCOCO's margin\n\n" + margin_table(results),
    ]
    merged = pooled(results)
    if merged:  # a method started more than once: its servers' mean, and their spread
        sections += [
            "## Each method's servers pooled: mean tok/s (spread between them)\n\n"
            + spread_table(merged),
            "## Pooled, against plain\n\n" + ratio_table(merged),
            "## Pooled, DCOCO's margin\n\n" + margin_table(merged),
        ]
    sections.append("## Latency per method\n\n" + "\n\n".join(map(console_table, results)))
    table = "\n\n".join(sections)
    (out / COMPARE_FILE).write_text(table + "\n")
    print(table)
    print(plot_throughput(results, out / PLOT_FILE) or "matplotlib is not installed")


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


def run_bench_serve(config: BenchServeConfig) -> tuple[dict, Path]:
    loads = checked_texts(config)
    base = config.url.rstrip("/")
    model = config.model or reachable_model(base)
    label = config.label or model
    out = Path(config.out or time.strftime(f"results/serve-{slug(label)}-%Y%m%d-%H%M%S"))
    [result] = load_servers([(label, base, model)], config, loads, {label: out})
    if config.plots:
        plot_throughput([result], out / PLOT_FILE)
    return result, out


def run_interleaved(config: BenchServeConfig) -> tuple[list[dict], Path]:
    """(every server's result in the one-server layout, out dir) of `--servers`, each level run
    by every server in turn (dcoco.eval.served.interleave)."""
    loads = checked_texts(config)
    servers = [(name, url, reachable_model(url)) for name, url in parse_servers(config.servers)]
    out = Path(config.out or time.strftime("results/serve-interleaved-%Y%m%d-%H%M%S"))
    dirs = {name: out / slug(name) for name, _, _ in servers}
    return load_servers(servers, config, loads, dirs), out


def load_servers(servers: list, config, loads: tuple, dirs: dict[str, Path]) -> list[dict]:
    """Every (label, url, model) server's result over `loads` (checked_texts), each level run by
    every server in turn, in `config.turns` turns (level_turns, turn_order), each result rewritten
    into its dir after every level."""
    texts, prompts = loads
    results = {name: new_result(name, url, model, config, prompts) for name, url, model in servers}
    for label, base, model in servers:
        dirs[label].mkdir(parents=True, exist_ok=True)
        if config.warmup:
            chat_request(base, model, texts[0], min(16, config.max_tokens), 0.0, config.timeout_s)
    levels = [(t, c) for t in config.temperatures for c in config.concurrency]
    for index, (temperature, concurrency) in enumerate(levels):
        turns = level_turns(texts, concurrency, config.rounds, config.turns)
        request_settings = (config.max_tokens, temperature, config.timeout_s)
        before = {label: _counters(base) for label, base, _ in servers}
        records: dict[str, list] = {label: [] for label, _, _ in servers}
        walls = dict.fromkeys(records, 0.0)
        for turn, batch in enumerate(turns):
            for label, base, model in turn_order(servers, index * len(turns) + turn):
                done, wall = run_level(base, model, batch, concurrency, *request_settings)
                records[label] += done
                walls[label] += wall
        for label, base, _ in servers:
            level = {"temperature": temperature, "concurrency": concurrency, "turns": len(turns)}
            level |= aggregate(records[label], walls[label])
            after = _counters(base)
            level["spec"] = spec_delta(before[label], after) if before[label] and after else None
            results[label]["levels"].append(level)
            print(level_line(label, level), file=sys.stderr)
            (dirs[label] / RESULT_FILE).write_text(json.dumps(results[label], indent=2) + "\n")
    return [results[label] for label, _, _ in servers]


def checked_texts(config: BenchServeConfig) -> tuple[list[str], list]:
    """(first turns, prompts) of the chosen suites, after checking the load's settings."""
    levels, temperatures = list(config.concurrency), list(config.temperatures)
    if not levels or min(levels) < 1:
        raise DcocoError("--concurrency needs integers >= 1")
    if not temperatures or min(temperatures) < 0:
        raise DcocoError("--temperatures needs numbers >= 0")
    if config.max_tokens <= 0:
        raise DcocoError("--max-tokens must be > 0")
    if not 1 <= config.turns <= config.rounds:
        raise DcocoError(
            "--turns must be between 1 and --rounds (each turn keeps every stream busy)"
        )
    prompts = load_prompts(config.data_dir, config.prompts, config.suites, config.limit)
    if not prompts:
        raise DcocoError("no prompts to send: the chosen suites are empty")
    return [prompt.turns[0] for prompt in prompts], prompts


def reachable_model(base: str) -> str:
    try:
        return served_model(base)
    except (urllib.error.URLError, OSError) as error:
        raise DcocoError(f"no server at {base} ({error}): start one with `dcoco serve`") from error


def new_result(label: str, base: str, model: str, config: BenchServeConfig, prompts) -> dict:
    return {
        "label": label,
        "url": base,
        "model": model,
        "config": portable_record(asdict(config)),
        "num_prompts": len(prompts),
        "suites": sorted({prompt.suite for prompt in prompts}),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "levels": [],
    }


def _counters(base: str) -> dict | None:
    try:
        return spec_counters(http_get(base + "/metrics"))
    except (urllib.error.URLError, OSError):
        return None


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "server"


COMMAND = Command(
    "bench-serve",
    "throughput/latency/acceptance of a running server vs concurrency",
    BenchServeConfig,
    run,
)
