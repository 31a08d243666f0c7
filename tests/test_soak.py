"""`dcoco soak` against a small fake OpenAI server on loopback: a correct server gives no
difference, no 5xx and every fuzzed body a 4xx; a server that corrupts one greedy reply under load
is caught; dropped streams are counted as disconnects, not truncations."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dcoco.eval.served.soak import SoakConfig, soak
from dcoco.serving.request_guard import check_body

FIELDS = frozenset({"model", "messages", "prompt", "max_tokens", "temperature", "top_p", "stream"})


def _valid(raw: bytes, path: str) -> bool:
    """The guard `dcoco serve` puts in front of vLLM, plus what needs the model: its name and
    its context (a fake one of 4,096 tokens, a prompt under 300 characters)."""
    if check_body(path, raw, FIELDS) is not None:
        return False
    body = json.loads(raw)
    return (
        body.get("model") == "fake"
        and body.get("max_tokens", 16) <= 4096
        and len(body.get("prompt", "")) < 300
    )


class FakeServer(ThreadingHTTPServer):
    corrupt_after = 0  # > 0: the greedy replies after this many are wrong
    greedy_served = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"data": [{"id": "fake"}]})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        if not _valid(raw, self.path):
            return self._send(400, {"error": {"message": "invalid request"}})
        body = json.loads(raw)
        prompt = body.get("prompt") or body["messages"][-1]["content"]
        words = [f"w{len(prompt)}x{i}" for i in range(12)]
        if body.get("temperature", 1.0) == 0:
            with threading.Lock():
                self.server.greedy_served += 1
                if 0 < self.server.corrupt_after < self.server.greedy_served:
                    words[3] = "garbage"
        chat = "messages" in body
        if not body.get("stream"):
            choice = (
                {"message": {"content": " ".join(words)}} if chat else {"text": " ".join(words)}
            )
            return self._send(200, {"choices": [{**choice, "finish_reason": "length"}]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i, word in enumerate(words):
                text = word if i == 0 else " " + word
                choice = {"delta": {"content": text}} if chat else {"text": text}
                if i == len(words) - 1:
                    choice["finish_reason"] = "length"
                self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client dropped the stream


@pytest.fixture
def server():
    httpd = FakeServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def config(server, **flags) -> SoakConfig:
    settings = dict(url=f"http://127.0.0.1:{server.server_address[1]}", clients=4,
                    duration_s=30.0, max_requests=300, disconnect=0.3, fuzz=0.2, max_context=64,
                    data_dir="/nonexistent", timeout_s=10.0)  # fmt: skip
    return SoakConfig(**{**settings, **flags})


def test_a_correct_server_passes_the_soak(server):
    record = soak(config(server, server_pid=os.getpid()))  # the fake server is this process
    assert record["rss_mib_by_minute"][0] > 0
    ((name, samples),) = record["rss_mib_by_process"].items()  # start and end at least
    assert name and len(samples) >= 2 and all(mib > 0 for mib in samples)
    counts = record["counts"]
    assert counts["sent"] == 300
    assert counts.get("greedy_differs", 0) == 0
    assert counts.get("unexpected_5xx", 0) == counts.get("unexpected_4xx", 0) == 0
    assert counts.get("hung", 0) == counts.get("truncated", 0) == 0
    assert counts.get("fuzz_accepted", 0) == counts.get("fuzz_4xx_unclear", 0) == 0
    assert counts["fuzz_4xx"] > 20 and counts["disconnected"] > 5 and counts["completed"] > 100
    names = {example["name"] for example in record["examples"]["fuzz_4xx"]}
    assert "unknown-role" in names or len(names) > 5


def test_a_server_that_corrupts_greedy_replies_under_load_is_caught(server):
    server.corrupt_after = 12 + 10  # the 12 references (6 prompts x 2 endpoints) stay right
    counts = soak(config(server, fuzz=0.0, disconnect=0.0))["counts"]
    assert counts["greedy_differs"] > 0


def test_prompts_come_from_the_suites_when_their_data_is_there():
    from dcoco.eval.served.soak import FALLBACK_PROMPTS, _prompts
    from dcoco.paths import data_dir

    if not (data_dir() / "gsm8k.jsonl").is_file():
        pytest.skip("no shared suite data beside the checkout")
    prompts = _prompts(SoakConfig(suites="gsm8k,humaneval", limit=2))
    assert len(prompts) == 4 and all(isinstance(p, str) and p for p in prompts)
    assert _prompts(SoakConfig(data_dir="/nonexistent")) == list(FALLBACK_PROMPTS)


def test_rss_is_read_minute_by_minute_and_drawn(tmp_path, drawn):
    from dcoco.eval.served.report import plot_rss, rss_minutes

    mib = 2**20
    rss = [(float(t), (100 + t) * mib) for t in range(0, 150, 5)]  # 0 .. 145 s, +1 MiB a second
    assert rss_minutes(rss) == [100.0, 160.0, 220.0, 245.0]  # minutes 0, 1, 2 and the last sample
    assert rss_minutes([]) == []
    assert plot_rss(rss, "soak", tmp_path / "rss.png").is_file()
    xs, ys = drawn["rss.png"]["lines"]["RSS"]
    assert xs[0] == 0 and xs[-1] == pytest.approx(145 / 60) and ys[-1] == 245


def test_rss_is_summed_over_the_process_tree_by_name():
    from dcoco.eval.served.soak import rss_by_process, rss_bytes

    code = "import subprocess, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        by_name = {}
        for _ in range(200):  # until the child is there
            by_name = rss_by_process(parent.pid)
            if "sleep" in by_name:
                break
            time.sleep(0.05)
        assert "sleep" in by_name and len(by_name) == 2  # the python parent and its child
        assert all(v > 0 for v in by_name.values())
        assert rss_bytes(parent.pid) == pytest.approx(sum(by_name.values()), rel=0.2)
        assert rss_by_process(2**22 + 1) == {}  # no such process: nothing, no error
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
