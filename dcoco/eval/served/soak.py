"""`dcoco soak`: N concurrent clients for a set time against an OpenAI-compatible server on
loopback, checking that every greedy reply equals the same request's reply taken alone.

First each prompt's greedy reply is taken alone, once per endpoint (the references). Then `clients`
threads send requests until `duration_s` or `max_requests` is reached: chat or completions, streamed
or not, greedy or sampled (sampled requests share steps with greedy ones, which is what broke
vLLM-CPU's speculative decoding), a share of streams dropped mid-way, and a share of fuzzed bodies
(dcoco.eval.served.soak_requests). It counts what came back: completed, greedy replies different
from their reference, fuzzed bodies answered 4xx with one clear line, with an unclear one (empty or
several lines) and those accepted (200), unexpected 4xx and 5xx, hung (no reply within `timeout_s`),
truncated streams, connection errors, and samples the server's RSS (`server_pid` and its children)
over time. Writes `<out>/soak.json` and, with a server pid, `<out>/rss.png` (its RSS over the
soak).
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from dcoco.config import Command
from dcoco.errors import DcocoError
from dcoco.eval.run_record import write_run_record
from dcoco.eval.served.bench import served_model
from dcoco.eval.served.report import plot_rss, rss_minutes
from dcoco.eval.served.soak_requests import fuzzed_bodies, pick_fuzz, request_body, send
from dcoco.eval.suites import load_prompts

FALLBACK_PROMPTS = (
    "Write a Python function that reverses a list.",
    "What is the capital of France? Answer in one sentence.",
    "Give three tips for sleeping better.",
    "Explain what a hash table is to a child.",
    "Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
    "List the first ten prime numbers.",
)
RSS_PLOT = "rss.png"
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# verdicts a correct server never earns
FAILURES = ("greedy_differs", "unexpected_5xx", "hung", "truncated", "malformed_reply",
            "fuzz_accepted", "fuzz_4xx_unclear")  # fmt: skip


@dataclass
class SoakConfig:
    url: str = "http://127.0.0.1:8000"  # the server's base URL (loopback)
    model: str = ""  # served model name; empty = the server's first model
    clients: int = 16  # concurrent client threads
    duration_s: float = 60.0  # load phase length
    max_requests: int = 5000  # stop after this many requests even before duration_s
    disconnect: float = 0.1  # share of streamed requests dropped mid-stream
    fuzz: float = 0.1  # share of requests with a fuzzed body
    sampled: float = 0.3  # share of well-formed requests at temperature 1 (not compared)
    stream: float = 0.5  # share of well-formed requests streamed
    max_tokens: int = 64  # reply length, at most
    max_context: int = 2048  # the served context length, for the over-long fuzz body
    suites: str = "gsm8k,humaneval,mtbench"  # prompt suites; built-in prompts without data
    data_dir: str = ""  # dir of <suite>.jsonl; empty = shared/data beside the repository
    limit: int = 4  # prompts per suite
    timeout_s: float = 120.0  # a request without a reply by then counts as hung
    server_pid: int = 0  # sample this process tree's RSS; 0 = do not
    seed: int = 0  # the clients' random choices (what to send, when to drop)
    out: str = "results/soak"  # output dir: soak.json


def _prompts(config: SoakConfig) -> list[str]:
    try:
        return [p.turns[0] for p in load_prompts(config.data_dir, "", config.suites, config.limit)]
    except DcocoError:
        return list(FALLBACK_PROMPTS)


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and its descendants (Linux /proc)."""
    return sum(rss_by_process(pid).values())


def rss_by_process(pid: int) -> dict[str, int]:
    """Resident memory of `pid` and its descendants by process name (the same names summed):
    which of a server's processes grows (vLLM's API server, EngineCore, Worker)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    by_name: dict[str, int] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            status = dict(
                line.split(":", 1)
                for line in Path(f"/proc/{current}/status").read_text().splitlines()
            )
        except OSError:
            status = {}
        if "VmRSS" in status:
            name = status["Name"].strip()
            by_name[name] = by_name.get(name, 0) + int(status["VmRSS"].split()[0]) * 1024
        todo.extend(children.get(current, []))
    return by_name


def references(config: SoakConfig, model: str, prompts: list[str]) -> dict:
    """(endpoint, prompt index) -> the greedy reply taken alone."""
    refs = {}
    for endpoint in PATHS:
        for index, prompt in enumerate(prompts):
            body = request_body(model, prompt, endpoint == "chat", False, 0.0, config.max_tokens)
            outcome = send(config.url, PATHS[endpoint], body, config.timeout_s, endpoint)
            if outcome.status != 200:
                raise DcocoError(
                    f"reference request failed ({outcome.status}): {outcome.error_message}"
                )
            refs[endpoint, index] = outcome.text
    return refs


def one_request(config, model, prompts, refs, bodies, rng: random.Random) -> tuple[str, dict]:
    """Send one random request -> (its verdict, details for the log)."""
    if rng.random() < config.fuzz:
        name, path, body = pick_fuzz(bodies, rng)
        outcome = send(config.url, path, body, config.timeout_s, f"fuzz:{name}")
        if 400 <= outcome.status < 500:
            # one clear line: a client shows it to a person as it is
            clear = outcome.error_message.strip() and "\n" not in outcome.error_message
            verdict = "fuzz_4xx" if clear else "fuzz_4xx_unclear"
            return verdict, {"name": name, "message": outcome.error_message[:200]}
        if outcome.status == 200:
            return "fuzz_accepted", {"name": name}
        return _failure(outcome, {"name": name, "fuzz_status": outcome.status})
    endpoint = rng.choice(sorted(PATHS))
    index = rng.randrange(len(prompts))
    stream = rng.random() < config.stream
    greedy = rng.random() >= config.sampled
    drop = rng.randint(1, 8) if stream and rng.random() < config.disconnect else 0
    body = request_body(model, prompts[index], endpoint == "chat", stream, 0.0 if greedy else 1.0,
                        config.max_tokens)  # fmt: skip
    kind = endpoint + ("-stream" if stream else "")
    outcome = send(config.url, PATHS[endpoint], body, config.timeout_s, kind, drop)
    if outcome.status != 200:
        return _failure(outcome, {"kind": kind})
    if outcome.dropped:
        return "disconnected", {}
    if not outcome.finished:
        return "truncated", {"kind": kind}
    if greedy and outcome.text != refs[endpoint, index]:
        return "greedy_differs", {"kind": kind, "prompt": index, "got": outcome.text[:300],
                                  "want": refs[endpoint, index][:300]}  # fmt: skip
    return "completed", {}


def _failure(outcome, details: dict) -> tuple[str, dict]:
    if outcome.status == -1:
        return "hung", details
    if outcome.status == 0:
        return "connection_error", {**details, "error": outcome.error_message[:200]}
    if outcome.status >= 500:
        return "unexpected_5xx", {
            **details,
            "status": outcome.status,
            "message": outcome.error_message[:200],
        }
    return "unexpected_4xx", {
        **details,
        "status": outcome.status,
        "message": outcome.error_message[:200],
    }


def soak(config: SoakConfig) -> dict:
    model = config.model or served_model(config.url)
    prompts = _prompts(config)
    refs = references(config, model, prompts)
    bodies = fuzzed_bodies(model, config.max_context)
    counts: Counter = Counter()
    examples: dict[str, list] = {}
    lock, stop = threading.Lock(), time.monotonic() + config.duration_s
    rss = [(0.0, rss_bytes(config.server_pid))] if config.server_pid else []
    started = time.monotonic()

    def client(number: int) -> None:
        rng = random.Random(config.seed * 1000 + number)
        while time.monotonic() < stop:
            with lock:
                if counts["sent"] >= config.max_requests:
                    return
                counts["sent"] += 1
            try:
                verdict, details = one_request(config, model, prompts, refs, bodies, rng)
            except (ValueError, KeyError, IndexError, AttributeError) as error:  # a bad reply
                verdict, details = "malformed_reply", {"error": repr(error)[:200]}
            with lock:
                counts[verdict] += 1
                if details and len(examples.setdefault(verdict, [])) < 20:
                    examples[verdict].append(details)

    threads = [
        threading.Thread(target=client, args=(i,), daemon=True) for i in range(config.clients)
    ]
    for thread in threads:
        thread.start()
    by_process = [(0.0, rss_by_process(config.server_pid))] if config.server_pid else []
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        now = round(time.monotonic() - started, 1)
        if config.server_pid and now - rss[-1][0] >= 5.0:
            rss.append((now, rss_bytes(config.server_pid)))
        if config.server_pid and now - by_process[-1][0] >= 60.0:
            by_process.append((now, rss_by_process(config.server_pid)))
    record = {"config": asdict(config), "model": model, "prompts": len(prompts),
              "wall_s": round(time.monotonic() - started, 1), "counts": dict(counts),
              "rss_bytes": rss, "examples": examples}  # fmt: skip
    if rss:
        record["rss_growth_bytes"] = rss[-1][1] - rss[0][1]
        record["rss_mib_by_minute"] = rss_minutes(rss)
        by_process.append((record["wall_s"], rss_by_process(config.server_pid)))
        names = sorted({name for _, sample in by_process for name in sample})
        record["rss_mib_by_process"] = {  # name -> MiB at the start, each minute and the end
            name: [round(sample.get(name, 0) / 2**20, 1) for _, sample in by_process]
            for name in names
        }
    return record


def run(config: SoakConfig) -> int:
    record = soak(config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(record, indent=2) + "\n")
    write_run_record(out, "soak", config)
    print(json.dumps(record["counts"], indent=1))
    if "rss_growth_bytes" in record:
        growth = record["rss_growth_bytes"] / 2**20
        print(f"server RSS growth: {growth:+.1f} MiB over {record['wall_s']} s")
        minutes = " ".join(f"{mib:.0f}" for mib in record["rss_mib_by_minute"])
        print(f"server RSS MiB by minute: {minutes}")
        for name, mib in record["rss_mib_by_process"].items():
            print(f"  {name}: {mib[0]:.0f} -> {mib[-1]:.0f} MiB")
        plot_rss(record["rss_bytes"], f"server RSS, {config.clients} clients", out / RSS_PLOT)
    print(f"soak: {out / 'soak.json'}", file=sys.stderr)
    bad = sum(record["counts"].get(k, 0) for k in FAILURES)
    return 1 if bad else 0


COMMAND = Command("soak", "concurrent clients, disconnects and fuzzed bodies against a server",
                  SoakConfig, run, description=__doc__.split("\n\n")[0])  # fmt: skip
