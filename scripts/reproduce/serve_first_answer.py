"""How soon a first `dcoco serve` answers on a machine it has never run on (issue 69: within 90 s).

Starts `dcoco serve --method METHOD` with default flags and an empty cache dir (a fresh machine:
no converted target, no kernels, no layout or schedule measured; the vLLM venv exists, as `make
venv-vllm` made it), and times from the command's start until `/health` answers 200 and until a
first greedy chat request of 32 tokens has its reply. Then stops the server. Run it with nothing
else on the machine. `--cache-dir DIR` starts from DIR instead (a machine that has converted the
target before). Writes results/serve/smollm2-serve-first-answer/first_answer.json (one entry per
run, by cache) and the servers' logs.
Usage: .venv/bin/python scripts/reproduce/serve_first_answer.py [--method dcoco] [--port 8772]
  [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from dcoco.eval.run_record import write_run_record  # noqa: E402
from dcoco.eval.served.bench import chat_request  # noqa: E402

OUT = ROOT / "results" / "serve" / "smollm2-serve-first-answer"
PROMPT = "Write a Python function that checks whether a string is a palindrome."


@dataclass
class FirstAnswerConfig:
    method: str
    port: int
    cache_dir: str  # empty: a new, empty one


def healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
    except OSError:
        return False


def first_answer(method: str, port: int, cache: Path, log: Path) -> dict:
    env = {**os.environ, "DCOCO_CACHE_DIR": str(cache)}
    command = [str(ROOT / ".venv" / "bin" / "dcoco"), "serve", "--method", method,
               "--port", str(port)]  # fmt: skip
    started = time.monotonic()
    server = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)  # fmt: skip
    try:
        while not healthy(port):
            if server.poll() is not None:
                raise SystemExit(f"dcoco serve exited with {server.returncode}; see {log}")
            if time.monotonic() - started > 1200:
                raise SystemExit(f"no /health after 20 minutes; see {log}")
            time.sleep(0.5)
        health_s = time.monotonic() - started
        reply = chat_request(f"http://127.0.0.1:{port}", "smollm2-135m-instruct", PROMPT, 32,
                             0.0, 600.0)  # fmt: skip
        answer_s = time.monotonic() - started
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=120)
    if not reply["ok"]:
        raise SystemExit(f"the first chat request failed: {reply['error']}; see {log}")
    return {"method": method, "health_s": round(health_s, 1), "first_reply_s": round(answer_s, 1),
            "reply_tokens": reply["completion_tokens"], "tau": reply["tau"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dcoco")
    parser.add_argument("--port", type=int, default=8772)
    parser.add_argument("--cache-dir", default="")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    name = "cached-target" if args.cache_dir else "fresh"
    log = OUT / f"server-{name}.log"
    if args.cache_dir:
        result = first_answer(args.method, args.port, Path(args.cache_dir).expanduser(), log)
    else:
        with tempfile.TemporaryDirectory(prefix="dcoco-fresh-cache-") as cache:
            result = first_answer(args.method, args.port, Path(cache), log)
    print(json.dumps(result))
    path = OUT / "first_answer.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**results, name: result}, indent=1) + "\n")
    config = FirstAnswerConfig(args.method, args.port, "<cache dir>" if args.cache_dir else "")
    write_run_record(OUT, "serve_first_answer.py", config)


if __name__ == "__main__":
    main()
