"""`dcoco bench-serve --servers LABEL=URL,...`: several running servers loaded in turn, level by
level, so that their ratios come from the same minutes.

On a shared 2-core VM the machine's own speed drifts by 10-30% over the tens of minutes a sweep
of one server after another takes (2026-12-04, Intel Xeon: the same `dcoco` server and schedule
served 62.2 tokens/s at one stream, then 44.4 forty minutes later), more than the margins the
sweep is read for. Here every server is up at once (started one after another, so that each
one's schedule probe had the machine alone) and, at each temperature and concurrency, each
server runs the level in turn; the order reverses from one level to the next, so no server always
goes first. An idle vLLM-CPU server only waits on its queue. Each server's result has the layout
of a one-server run (`<out>/<label>/bench_serve.json`), so `--compare` reads it as before.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dcoco.errors import DcocoError
from dcoco.eval.serving_bench import (
    RESULT_FILE,
    chat_request,
    checked_texts,
    measure_level,
    new_result,
    reachable_model,
    slug,
)
from dcoco.eval.serving_bench_report import level_line


def parse_servers(specs: tuple[str, ...]) -> list[tuple[str, str]]:
    """`LABEL=URL` items -> [(label, base url)], labels unique."""
    servers = []
    for spec in specs:
        label, sep, url = spec.partition("=")
        if not sep or not label.strip() or not url.strip():
            raise DcocoError(f"--servers takes LABEL=URL items, got '{spec}'")
        servers.append((label.strip(), url.strip().rstrip("/")))
    labels = [label for label, _ in servers]
    if len(set(labels)) != len(labels):
        raise DcocoError(f"--servers labels must differ: {', '.join(labels)}")
    return servers


def run_interleaved(config) -> tuple[list[dict], Path]:
    """(every server's result in the one-server layout, out dir), measured level by level in
    alternation; `config` is a BenchServeConfig."""
    texts, prompts = checked_texts(config)
    servers = [(name, base, reachable_model(base)) for name, base in parse_servers(config.servers)]
    out = Path(config.out or time.strftime("results/serve-interleaved-%Y%m%d-%H%M%S"))
    results = {name: new_result(name, url, model, config, prompts) for name, url, model in servers}
    for label, base, model in servers:
        (out / slug(label)).mkdir(parents=True, exist_ok=True)
        if config.warmup:
            chat_request(base, model, texts[0], min(16, config.max_tokens), 0.0, config.timeout_s)
    step = 0
    for temperature in config.temperatures:
        for concurrency in config.concurrency:
            order = servers if step % 2 == 0 else servers[::-1]
            step += 1
            for label, base, model in order:
                level = measure_level(base, model, texts, concurrency, temperature, config)
                results[label]["levels"].append(level)
                print(level_line(label, level), file=sys.stderr)
                path = out / slug(label) / RESULT_FILE
                path.write_text(json.dumps(results[label], indent=2) + "\n")
    return [results[label] for label, _, _ in servers], out
