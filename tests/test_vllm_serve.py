"""`dcoco serve` answering over HTTP (a subprocess with vLLM's own engine processes): concurrent
greedy requests with speculative metrics, then a short soak (disconnects, fuzzed bodies, sampled
neighbours). Needs vLLM: `.venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_serve.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest
from conftest import VLLM_ENV as ENV
from conftest import VLLM_PROMPTS as PROMPTS
from conftest import VLLM_TARGET as TARGET
from conftest import stop_server, wait_healthy

from dcoco.serving.layout import free_port


@pytest.mark.vllm
def test_dcoco_serve_answers_concurrent_requests_with_spec_metrics(dcoco_checkpoint, tmp_path):
    from dcoco.eval.served.bench import run_level
    from dcoco.eval.served.metrics import spec_counters
    from dcoco.eval.served.soak import FAILURES, SoakConfig, soak

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "dcoco", "serve", "--method", "dcoco",
        "--checkpoint", str(dcoco_checkpoint), "--dtype", "fp32", "--port", str(port),
        "--max-model-len", "512", "--kv-cache-gib", "0.125", "--max-num-seqs", "16",
        # no probe servers or schedule probe: this test is about the served answers
        "--layout", "vllm-default", "--draft-schedule", "fixed",
    ]  # fmt: skip
    env = {**os.environ, **ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed in finally
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)  # fmt: skip
    try:
        wait_healthy(base, server, timeout=900)
        records, _ = run_level(base, TARGET, PROMPTS * 6, 16, max_tokens=16, temperature=0.0)
        assert len(records) == 18 and all(r["ok"] for r in records), records
        assert all(r["completion_tokens"] > 0 for r in records)
        metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
        assert "vllm:spec_decode_num_drafts_total" in metrics
        assert spec_counters(metrics)["drafts"] > 0
        assert records[0]["tau"] is not None  # --per-request-spec-decode-metrics summary
        # a short soak: greedy and sampled neighbours, dropped streams, fuzzed bodies
        soaked = soak(SoakConfig(url=base, model=TARGET, clients=8, duration_s=45.0,
                                 max_requests=400, max_tokens=24, max_context=512,
                                 data_dir=str(tmp_path / "no-suites"), timeout_s=120.0,
                                 server_pid=server.pid))  # fmt: skip
        counts = soaked["counts"]
        print("soak:", counts, "RSS growth MiB:", soaked.get("rss_growth_bytes", 0) / 2**20)
        wrong = FAILURES  # the request guard answers every fuzzed body
        assert not {k: counts[k] for k in wrong if counts.get(k)}, soaked["examples"]
        assert counts.get("completed", 0) > 0 and counts.get("disconnected", 0) > 0
    finally:
        stop_server(server)
        log.close()
