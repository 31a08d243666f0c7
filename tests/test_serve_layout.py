"""`dcoco serve --layout auto`: each layout (and dtype) is timed on a real (here: fake) server,
the winner is cached, and the layout's environment reaches the server process."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from dcoco.errors import DcocoError
from dcoco.serving import layout

# An OpenAI-shaped server: /v1/models, and chat completions whose token count says which layout
# environment it was started with (64 tokens with no reserved core, 32 otherwise), after a delay.
FAKE_SERVER = textwrap.dedent(
    """
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port = int(sys.argv[sys.argv.index("--port") + 1])
    tokens = 64 if os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == "0" else 32
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass
        def reply(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self.reply({"data": [{"id": "fake"}]})
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(0.2)
            self.reply({"usage": {"completion_tokens": tokens}, "choices": [{}]})
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return [str(script), "--port", "0"]


def test_the_faster_layout_wins_and_is_cached(fake_server, monkeypatch):
    candidates = {(name, "bf16"): fake_server for name in layout.LAYOUTS}
    best, rates = layout.choose_setup(sys.executable, candidates, {"machine": "m"})
    assert best == ("all-cores", "bf16")  # its environment doubled the fake's tokens per reply
    assert rates["all-cores bf16"] > 1.5 * rates["vllm-default bf16"] > 0
    monkeypatch.setattr(layout, "probe_layout", lambda *a: pytest.fail("cached: no probe"))
    assert layout.choose_setup(sys.executable, candidates, {"machine": "m"}) == (best, rates)


def test_a_server_that_dies_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    dying = tmp_path / "dying.py"
    dying.write_text("import sys; print('no model here', file=sys.stderr); sys.exit(3)")
    with pytest.raises(DcocoError, match="(?s)exited while starting.*no model here"):
        layout.probe_layout(sys.executable, [str(dying), "--port", "0"], "vllm-default")


def test_layout_names():
    assert layout.check_layout("auto") == "auto"
    with pytest.raises(DcocoError, match="unknown layout"):
        layout.check_layout("fast")
    assert layout.layout_env("all-cores")["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert json.dumps(layout.LAYOUTS["vllm-default"]) == "{}"  # vLLM's own binding, untouched
