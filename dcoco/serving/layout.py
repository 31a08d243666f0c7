"""How vLLM-CPU lays its processes over the cores, chosen by measuring on the machine it runs on.

vLLM's OpenAI server always runs three processes on CPU: the API frontend, the EngineCore
(scheduler) and the worker. By default the worker's OpenMP threads are bound to every core but
one, which vLLM reserves for the scheduler (a busy loop, "TODO: make scheduler proc sleep when
idle" in vllm/utils/ompmultiprocessing.py). On a 2-core machine that leaves the model one core.
The candidates:
- `vllm-default`: vLLM's own binding (one core reserved);
- `all-cores`: no core reserved (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`): the worker gets every core and
  shares one with the scheduler.
`--layout auto` times each candidate once per machine and method (a real server on a free port,
one warm-up request, then one timed 64-token reply at one stream) and caches the winner under
`$DCOCO_CACHE_DIR/serve-layouts/`; with `--dtype auto` each layout is timed at each of
AUTO_DTYPES too (the precision vLLM runs the target in; bf16 wins where the CPU has native bf16
matmuls, and may lose where they are emulated). A drafter method whose draft schedule is measured
(`--draft-schedule auto`) is also timed drafting nothing at each precision: the schedule may
choose that at every load, and a precision that drafts fast can still decode one token at a time
slower than another (fp32 against emulated bf16 on an AVX2 Zen 3: 12.3 tokens/s drafting, while
bf16 plain ran 16.4).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dcoco.errors import DcocoError
from dcoco.eval.served.bench import chat_request, http_get
from dcoco.paths import cache_dir

LAYOUTS = {
    "vllm-default": {},
    "all-cores": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
}
AUTO_DTYPES = ("bf16", "fp32")
PROBE_PROMPT = "Write a short story about a robot who learns to paint."
PROBE_TOKENS = 64
START_TIMEOUT_S = 600.0


def check_layout(name: str) -> str:
    if name != "auto" and name not in LAYOUTS:
        raise DcocoError(f"unknown layout '{name}': choose auto or one of {', '.join(LAYOUTS)}")
    return name


def layout_env(name: str) -> dict[str, str]:
    return {**os.environ, **LAYOUTS[name]}


def choose_setup(
    python: str, candidates: dict[tuple[str, ...], list[str]], key: dict, measure: bool = True
) -> tuple[tuple[str, ...], dict[str, float]] | None:
    """The fastest of `candidates`, each (layout, dtype[, variant]) mapped to its server argv,
    and the tokens/s of each (the words joined -> rate), cached by `key`; None where nothing is
    cached and `measure` is False."""
    path = _cache_path({**key, "candidates": sorted(" ".join(c) for c in candidates)})
    if path.is_file():
        try:
            record = json.loads(path.read_text())
            best = tuple(record["best"])
            if best in candidates:
                return best, record["tokens_per_s"]
        except (ValueError, KeyError, TypeError):
            pass  # measured again below
    if not measure:
        return None
    rates, started = {}, time.perf_counter()
    for done, (candidate, argv) in enumerate(candidates.items()):
        name, setting = candidate[0], " ".join(candidate[1:])
        left = time_left(started, done, len(candidates))
        print(f"dcoco: timing vLLM layout '{name}' at {setting} ({done + 1}/{len(candidates)}"
              f"{left}, once per machine)", file=sys.stderr)  # fmt: skip
        rates[" ".join(candidate)] = probe_layout(python, argv, name)
    best = max(candidates, key=lambda c: rates[" ".join(c)])
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"best": best, "tokens_per_s": rates, "key": key}
    path.write_text(json.dumps(record, indent=1))
    return best, rates


def time_left(started: float, done: int, total: int) -> str:
    """The words ", about N min left", from the mean time of the `done` of `total` steps since
    `started` (empty before the first is done)."""
    if done == 0:
        return ""
    seconds = (time.perf_counter() - started) / done * (total - done)
    return f", about {max(1, round(seconds / 60))} min left"


def probe_layout(python: str, argv: list[str], name: str) -> float:
    """Tokens/s of one 64-token greedy reply from a server started with layout `name`."""
    port = free_port()
    command = [python, *_with_port(argv, port)]
    log = cache_dir() / "serve-layouts" / f"probe-{name}.log"  # a file: a pipe would fill up
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        server = subprocess.Popen(
            command, env=layout_env(name), stdout=sink, stderr=sink, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        model = _wait_until_up(server, base, log)
        chat_request(base, model, PROBE_PROMPT, 8, 0.0, START_TIMEOUT_S)  # warm-up
        reply = chat_request(base, model, PROBE_PROMPT, PROBE_TOKENS, 0.0, START_TIMEOUT_S)
    finally:
        _stop(server)
    if not reply["ok"] or not reply["completion_tokens"]:
        raise DcocoError(f"layout '{name}': the probe request failed: {reply.get('error')}")
    return round(reply["completion_tokens"] / reply["latency_s"], 2)


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the probe's whole process group: its EngineCore and worker
    must not outlive it and slow the next probe (or the real server)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            server.poll()  # reap the leader, or the group never empties
            try:
                os.killpg(server.pid, 0)  # is any member left?
            except ProcessLookupError:
                return
            time.sleep(0.5)


def _wait_until_up(server: subprocess.Popen, base: str, log: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise DcocoError(f"the vLLM server exited while starting (log {log}):\n{tail}")
        try:
            models = json.loads(http_get(base + "/v1/models", timeout=5))["data"]
            return models[0]["id"]
        except (OSError, ValueError, KeyError, IndexError):
            time.sleep(2)
    raise DcocoError(f"the vLLM server did not come up within {START_TIMEOUT_S:.0f} s")


def _with_port(argv: list[str], port: int) -> list[str]:
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    return argv


def free_port() -> int:
    """A port on 127.0.0.1 that no socket holds now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "serve-layouts" / f"{digest}.json"
