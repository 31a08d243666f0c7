"""`dcoco bench-serve` and `dcoco serve` without vLLM: metric parsing and aggregation on canned
/metrics text, a whole run against a small fake OpenAI server on loopback. The serve command:
tests/test_serve_command.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dcoco.cli import main
from dcoco.errors import DcocoError
from dcoco.eval.served.bench import BenchServeConfig, run_bench_serve
from dcoco.eval.served.metrics import (
    aggregate,
    parse_metrics,
    percentile,
    spec_counters,
    spec_delta,
)

METRICS = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def _counters(drafts, draft_tokens, accepted, per_pos):
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "per_position": per_pos,
    }


def test_parse_metrics_reads_names_labels_and_values():
    samples = parse_metrics(METRICS)
    assert ("vllm:num_requests_running", {"engine": "0", "model_name": "m"}, 0.0) in samples
    assert all(not name.startswith("#") for name, _, _ in samples)
    assert len(samples) == 8


def test_spec_counters_sum_engines_and_order_positions():
    second_engine = METRICS.replace('engine="0"', 'engine="1"')
    counters = spec_counters(METRICS + second_engine)
    assert counters == _counters(20.0, 300.0, 24.0, [14.0, 8.0, 2.0])
    assert spec_counters("") == _counters(0.0, 0.0, 0.0, [])


def test_spec_delta_gives_tau_and_per_position_acceptance():
    before = _counters(10, 150, 12, [7, 4, 1])
    after = _counters(30, 450, 52, [22, 14, 4, 2])  # a position seen for the first time
    delta = spec_delta(before, after)
    assert delta["drafts"] == 20 and delta["accepted_tokens"] == 40
    assert delta["tau"] == pytest.approx(3.0)
    assert delta["acceptance_rate"] == pytest.approx(40 / 300)
    assert delta["per_position"] == pytest.approx([0.75, 0.5, 0.15, 0.1])
    assert delta["per_position_conditional"] == pytest.approx([0.75, 10 / 15, 0.3, 2 / 3])
    idle = spec_delta(before, before)
    assert idle["tau"] is None and idle["per_position"] == []


def test_percentile_and_aggregate():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 90) == pytest.approx(90)
    records = [
        {"ok": True, "latency_s": 1.0, "completion_tokens": 10, "tau": 2.0},
        {"ok": True, "latency_s": 3.0, "completion_tokens": 30, "tau": None},
        {"ok": False, "latency_s": 0.1, "error": "boom"},
    ]
    summary = aggregate(records, wall_s=4.0)
    assert summary["requests"] == 3 and summary["errors"] == 1
    assert summary["output_tokens"] == 40 and summary["output_tok_s"] == pytest.approx(10.0)
    assert summary["requests_per_s"] == pytest.approx(0.5)
    assert summary["latency_s"]["p50"] == pytest.approx(2.0)
    assert summary["latency_s"]["mean"] == pytest.approx(2.0)
    assert summary["per_request_tau_mean"] == pytest.approx(2.0)


class _FakeServer(BaseHTTPRequestHandler):
    """/v1/models, /v1/chat/completions (8 tokens, 2 drafts of 4 with 3 accepted), /metrics."""

    lock = threading.Lock()
    drafts = 0
    accepted = 0
    ports: list[int] = []  # which server answered each completion, in order

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/v1/models":
            self._send({"data": [{"id": "fake-model"}]})
        elif self.path == "/metrics":
            with self.lock:
                text = (
                    f'vllm:spec_decode_num_drafts_total{{engine="0"}} {self.drafts}\n'
                    f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {4 * self.drafts}\n'
                    f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.accepted}\n'
                )
            self._send(text)
        else:
            self.send_error(404)

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["model"] == "fake-model" and body["messages"][0]["role"] == "user"
        with self.lock:
            type(self).drafts += 2
            type(self).accepted += 3
            type(self).ports.append(self.server.server_address[1])
        self._send(
            {
                "choices": [{"finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 8},
                "metrics": {"speculative_decoding": {"mean_acceptance_length": 2.5}},
            }
        )

    def _send(self, payload):
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args):
        pass


def _serve():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def fake_server():
    server = _serve()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _run_two_servers(tmp_path, labels, **settings) -> tuple[int, int]:
    """`dcoco bench-serve --servers` over two fake servers labelled `labels` and 3 prompts, at 1
    and 2 streams; their ports (every request's port lands in _FakeServer.ports, in order)."""
    from dcoco.eval.served.bench import run

    servers = [_serve(), _serve()]
    a, b = (server.server_address[1] for server in servers)
    prompts = tmp_path / "suite.jsonl"
    records = [{"id": str(i), "category": "chat", "turns": [f"hi {i}"]} for i in range(3)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = BenchServeConfig(
        servers=(f"{labels[0]}=http://127.0.0.1:{a}", f"{labels[1]}=http://127.0.0.1:{b}/"),
        prompts=str(prompts),
        suites="all",
        concurrency=(1, 2),
        max_tokens=8,
        warmup=False,
        out=str(tmp_path / "out"),
        **settings,
    )
    _FakeServer.ports.clear()
    try:
        assert run(config) == 0
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    return a, b


def test_several_servers_are_loaded_in_turn_level_by_level(tmp_path, drawn):
    a, b = _run_two_servers(tmp_path, ("plain", "dcoco@x"))
    # level 1 (3 requests): plain, then dcoco; level 2 (4 requests): the order reversed
    assert _FakeServer.ports == [a] * 3 + [b] * 3 + [b] * 4 + [a] * 4
    for name, label in (("plain", "plain"), ("dcoco-x", "dcoco@x")):
        result = json.loads((tmp_path / "out" / name / "bench_serve.json").read_text())
        assert result["label"] == label and [lv["concurrency"] for lv in result["levels"]] == [1, 2]
        assert all(lv["spec"]["tau"] == pytest.approx(2.5) for lv in result["levels"])
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| plain | 0 | 1.00× | 1.00× |" in summary and "\n| dcoco | 0 | " in summary


def test_levels_split_into_turns_alternate_the_servers_within_a_level(tmp_path, drawn):
    a, b = _run_two_servers(tmp_path, ("plain", "dflash"), rounds=4, turns=2)
    # level 1: 4 requests in 2 turns of 2, A B B A; level 2: 8 requests in 2 turns of 4, A B B A
    assert _FakeServer.ports == [a] * 2 + [b] * 4 + [a] * 2 + [a] * 4 + [b] * 8 + [a] * 4
    for name in ("plain", "dflash"):
        result = json.loads((tmp_path / "out" / name / "bench_serve.json").read_text())
        levels = result["levels"]
        assert [(lv["requests"], lv["output_tokens"], lv["turns"]) for lv in levels] == [
            (4, 32, 2),
            (8, 64, 2),
        ]  # every turn's requests in one level, its counters' delta over both turns
        assert all(lv["spec"]["tau"] == pytest.approx(2.5) for lv in levels)


@pytest.mark.parametrize("turns", [0, 3])
def test_turns_must_fit_the_rounds(tmp_path, turns):
    from dcoco.eval.served.bench import run

    prompts = tmp_path / "suite.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "chat", "turns": ["hi"]}) + "\n")
    config = BenchServeConfig(
        servers=("plain=http://127.0.0.1:9",), prompts=str(prompts), suites="all", turns=turns
    )
    with pytest.raises(DcocoError, match="--turns"):
        run(config)


@pytest.mark.parametrize("servers", [("plain",), ("a=http://x", "a=http://y"), ("=http://x",)])
def test_servers_need_distinct_labels_and_urls(servers):
    from dcoco.eval.served.interleave import parse_servers

    with pytest.raises(DcocoError, match="--servers"):
        parse_servers(servers)


def test_bench_serve_runs_end_to_end_against_a_server(fake_server, tmp_path, drawn):
    prompts = tmp_path / "suite.jsonl"
    records = [{"id": str(i), "category": "chat", "turns": [f"hi {i}", "more"]} for i in range(3)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = BenchServeConfig(
        url=fake_server + "/",
        prompts=str(prompts),
        suites="all",
        concurrency=(1, 2),
        temperatures=(0.0, 1.0),
        max_tokens=8,
        label="fake",
        out=str(tmp_path / "out"),
    )
    result, out = run_bench_serve(config)
    assert [(lv["temperature"], lv["concurrency"]) for lv in result["levels"]] == [
        (0.0, 1),
        (0.0, 2),
        (1.0, 1),
        (1.0, 2),
    ]
    for level in result["levels"]:
        # 3 prompts; at concurrency 2 they are cycled to 2 rounds x 2 streams = 4 requests
        requests = max(3, 2 * level["concurrency"])
        assert level["requests"] == requests and level["errors"] == 0
        assert level["output_tokens"] == 8 * requests
        assert level["spec"]["tau"] == pytest.approx(1 + 3 / 2)
        assert level["per_request_tau_mean"] == pytest.approx(2.5)
    assert json.loads((out / "bench_serve.json").read_text())["label"] == "fake"
    # the figure draws output tok/s against concurrency, one line per temperature
    lines = drawn.pop("throughput_vs_concurrency.png")["lines"]
    assert set(lines) == {"fake T=0", "fake T=1"}
    for temperature, label in ((0.0, "fake T=0"), (1.0, "fake T=1")):
        levels = [lv for lv in result["levels"] if lv["temperature"] == temperature]
        assert lines[label] == ([1, 2], [lv["output_tok_s"] for lv in levels])
    # --compare redraws several runs in one figure, without a server
    other = {**result, "label": "other"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    compared = tmp_path / "cmp"
    files = f"{out / 'bench_serve.json'},{tmp_path / 'other.json'}"
    assert main(["bench-serve", "--compare", files, "--out", str(compared)]) == 0
    assert set(drawn["throughput_vs_concurrency.png"]["lines"]) == {
        "fake T=0", "fake T=1", "other T=0", "other T=1"
    }  # fmt: skip
    table = (compared / "summary.md").read_text()
    assert "| fake | 0 |" in table and "c=2 tok/s" in table


def test_bench_serve_without_a_server_is_a_clear_error(tmp_path, capsys):
    prompts = tmp_path / "suite.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "chat", "turns": ["hi"]}) + "\n")
    argv = [
        "bench-serve",
        "--url",
        "http://127.0.0.1:9",
        "--prompts",
        str(prompts),
        "--suites",
        "all",
    ]
    code = main(argv)
    assert code == 2 and "dcoco serve" in capsys.readouterr().err


def test_compare_tables_give_ratios_to_plain_and_dcocos_margins():
    from dcoco.eval.served.report import margin_table, ratio_table

    def run(label: str, rates: dict[int, float]) -> dict:
        levels = [
            {"temperature": 0.0, "concurrency": c, "output_tok_s": r} for c, r in rates.items()
        ]
        return {"label": label, "levels": levels}

    results = [
        run("plain", {1: 50.0, 8: 200.0}),
        run("dflash@dflash", {1: 80.0, 8: 190.0}),
        run("dcoco@dcoco-joint-12k", {1: 100.0, 8: 200.0}),
        run("dspark@dspark-dropin", {1: 90.0, 8: 100.0}),
        run("domino@domino-dropin", {1: 40.0, 8: 160.0}),
        run("dcoco:greedy/4@dcoco-joint-12k", {1: 120.0, 8: 100.0}),  # another rule: its own row
    ]
    ratios = ratio_table(results)
    assert "| dcoco | 0 | 2.00× | 1.00× |" in ratios
    assert "| dcoco:greedy/4 | 0 | 2.40× | 0.50× |" in ratios
    assert "| dflash | 0 | 1.60× | 0.95× |" in ratios
    margins = margin_table(results)
    assert "| dflash | 0 | 1.25× | 1.05× |" in margins
    # the best sequential head per level: dspark at 1 stream (90), domino at 8 (160)
    assert "| best sequential head | 0 | 1.11× | 1.25× |" in margins
    assert "| dflash (`dcoco:greedy/4`) | 0 | 1.50× | 0.53× |" in margins
    assert margins.index("| dflash |") < margins.index("| dflash (`dcoco:greedy/4`)")
