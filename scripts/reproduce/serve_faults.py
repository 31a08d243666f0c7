"""Fault runs against `dcoco serve` (loopback only): what clients see when vLLM's engine process is
killed mid-stream, and when the server gets SIGTERM with streams in flight.

1. engine kill: 4 streamed greedy requests, then SIGKILL to the EngineCore process; each client
   must get an error or a cut stream within the timeout, never hang; the server must exit
   non-zero (it cannot recover an engine), with its last log lines saying why.
2. SIGTERM: 4 streamed requests, then SIGTERM to the server; with `--shutdown-timeout` (dcoco
   serve's default 30 s) vLLM drains: the in-flight replies finish, then the server exits 0.
Writes results/serve/smollm2-serve-faults/faults.json.
Usage: .venv/bin/python scripts/reproduce/serve_faults.py [--method dflash] [--port 8771]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from dcoco.eval.run_record import write_run_record  # noqa: E402
from dcoco.eval.served.soak_requests import request_body, send  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and a storm."


def start_server(method: str, port: int, log: Path) -> subprocess.Popen:
    command = [str(ROOT / ".venv" / "bin" / "dcoco"), "serve", "--method", method, "--dtype",
               "fp32", "--port", str(port), "--layout", "all-cores"]  # fmt: skip
    server = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"dcoco serve exited with {server.returncode}; see {log}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                return server
        except OSError:
            time.sleep(2)
    raise SystemExit("no healthy server")


def streams(port: int, count: int, max_tokens: int, timeout: float) -> tuple[list, list]:
    """Start `count` streamed requests in threads -> (threads, outcomes filled as they end)."""
    outcomes: list = []
    body = request_body("smollm2-135m-instruct", PROMPT, True, True, 0.0, max_tokens)

    def one() -> None:
        started = time.monotonic()
        outcome = send(f"http://127.0.0.1:{port}", "/v1/chat/completions", body, timeout,
                       "chat-stream")  # fmt: skip
        outcomes.append({"status": outcome.status, "finished": outcome.finished,
                         "chars": len(outcome.text), "error": outcome.error_message[:200],
                         "seconds": round(time.monotonic() - started, 1)})  # fmt: skip

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, outcomes


def engine_pids(server_pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if "EngineCore" in (proc / "cmdline").read_bytes().decode(errors="replace") and (
                os.getsid(int(proc.name)) == os.getsid(server_pid)
            ):
                found.append(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return found


def wait_exit(server: subprocess.Popen, seconds: float) -> int | None:
    try:
        return server.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def run_fault(name: str, method: str, port: int, out: Path, inject) -> dict:
    log = out / f"{name}.server.log"
    server = start_server(method, port, log)
    threads, outcomes = streams(port, 4, 400, timeout=120.0)
    time.sleep(6.0)  # the streams are under way
    injected = time.monotonic()
    inject(server)
    for thread in threads:
        thread.join(timeout=150)
    code = wait_exit(server, 90)
    if code is None:
        os.killpg(server.pid, signal.SIGKILL)
    # dcoco serve's own lines (vLLM's carry this machine's paths)
    ours = [line[line.index("dcoco:") :] for line in log.read_text(errors="replace").splitlines()
            if "dcoco:" in line]  # fmt: skip
    return {"clients": outcomes, "hung": sum(t.is_alive() for t in threads),
            "server_exit": code, "server_exit_s": round(time.monotonic() - injected, 1),
            "dcoco_lines": ours[-3:]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", default="dflash")
    parser.add_argument("--port", type=int, default=8771)
    args = parser.parse_args()
    out = ROOT / "results" / "serve" / "smollm2-serve-faults"
    out.mkdir(parents=True, exist_ok=True)

    def kill_engine(server):
        pids = engine_pids(server.pid)
        if not pids:
            raise SystemExit("no EngineCore process found")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    result = {
        "method": args.method,
        "engine_kill": run_fault("engine_kill", args.method, args.port, out, kill_engine),
        "sigterm": run_fault(
            "sigterm",
            args.method,
            args.port,
            out,
            lambda server: server.send_signal(signal.SIGTERM),
        ),  # fmt: skip
    }
    (out / "faults.json").write_text(json.dumps(result, indent=2) + "\n")
    write_run_record(out, "serve-faults", FaultConfig(args.method, args.port))
    print(json.dumps(result, indent=2))


@dataclass
class FaultConfig:  # what run.json records of this script's flags
    method: str
    port: int


if __name__ == "__main__":
    main()
