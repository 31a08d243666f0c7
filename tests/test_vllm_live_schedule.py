"""The `auto` schedule chosen again inside vLLM from the served acceptance
(dcoco.serving.live_schedule): an engine started with a probe record that drafts at one request
only moves to drafting at every load once its traffic accepts more than the record predicted, its
scheduler and worker take the new schedule, and greedy fp32 output stays plain vLLM's.

Run in the vLLM venv (`make test-vllm`), in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0: the
worker's `collective_rpc` then runs in-process, as the server's runs in its worker process)."""

from __future__ import annotations

import dataclasses
import gc
import json

import pytest
from conftest import vllm_test_engine

from dcoco.paths import checkpoints_dir
from dcoco.serving.draft_schedule import OPEN_END, parse_pair
from dcoco.serving.vllm.settings import SETTINGS_ENV, PluginSettings

TARGET = "smollm2-135m-instruct"
PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is 12 times 14?",
    "Name three planets.",
    "Explain in two sentences what a compiler does.",
]
ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# K = 0 and K = 7 timed. At the record's acceptance (τ 1.06 from 2 drafts on) one request drafts
# one token and more requests none (2 x 1.06 / 0.038 = 56 tokens/s < 2 / 0.032 = 62.5 at two);
# the shipped drafter's first draft is accepted far more often (0.26 on these replies, fp32), and
# from τ 1.22 on every load drafts (8 x 1.22 / 0.055 = 177.5 at eight).
STEPS = {
    "0": {"1": 0.030, "2": 0.032, "4": 0.036, "8": 0.045},
    "7": {"1": 0.031, "2": 0.038, "4": 0.042, "8": 0.055},
}
RECORD = {
    "schedule": "1:1,2-:0/1-:0",
    "step_s": {"0": STEPS, "1": STEPS},
    "acceptance": {"0": [0.05, 0.01, 0, 0, 0, 0, 0], "1": [0.01, 0, 0, 0, 0, 0, 0]},
}


def _chat(llm, prompts: list[str], max_tokens: int = 32) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _close(llm) -> None:
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


@pytest.mark.vllm
def test_live_schedule_follows_the_traffic_and_output_stays_plain(monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    from dcoco.models.target.loading import resolve_target
    from dcoco.serving import live_schedule, served_acceptance

    record = tmp_path / "record.json"
    record.write_text(json.dumps(RECORD))
    scheduled = PluginSettings().with_schedule(RECORD["schedule"])
    for key, value in {**ENV, **scheduled.environment()}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(live_schedule, "RECHOOSE_BLOCKS", 8)
    monkeypatch.setattr(live_schedule, "RECHOOSE_S", 0.0)
    monkeypatch.setattr(served_acceptance, "PRIOR_ROUNDS", 1)  # a short run outweighs the record
    model = str(resolve_target(TARGET))
    plain = vllm_test_engine(model, None)
    try:
        expected = _chat(plain, PROMPTS)
    finally:
        _close(plain)
    live = dataclasses.replace(scheduled, live_record=str(record))
    monkeypatch.setenv(SETTINGS_ENV, live.environment()[SETTINGS_ENV])
    live_schedule.install()  # the plugin installs it at vLLM's start; idempotent
    greedy, _ = parse_pair(RECORD["schedule"], OPEN_END)
    speculative = {
        "method": "dflash",
        "model": str(checkpoints_dir() / TARGET / "dflash"),
        "num_speculative_tokens": 7,
        "num_speculative_tokens_per_batch_size": [list(r) for r in greedy],
    }
    llm = vllm_test_engine(model, speculative, disable_log_stats=False)
    try:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        assert list(scheduler.dynamic_sd_lookup)[4] == 0 and scheduler.dcoco_live is not None
        for prompt in PROMPTS:  # one request at a time: one draft each step, counted
            _chat(llm, [prompt])
        live = scheduler.dcoco_live
        assert live.counts[("0", True)].blocks >= 8
        assert live.text != RECORD["schedule"] and list(scheduler.dynamic_sd_lookup)[4] > 0
        moved, _ = parse_pair(live.text, OPEN_END)
        assert runner.speculative_config.num_speculative_tokens_per_batch_size == [
            list(r) for r in moved
        ]
        before = live.counts[("0", True)].blocks
        assert _chat(llm, PROMPTS) == expected  # four at once, drafting now
        assert live.counts[("0", True)].blocks > before
    finally:
        _close(llm)
