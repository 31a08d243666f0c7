"""Load-aware drafting inside vLLM: a batch-size schedule that drops to K = 0 drafts keeps greedy
fp32 output equal to plain vLLM's, and the K = 0 steps take our shortcuts (the drafter's context
only, plain sampling; dcoco.serving.vllm.no_draft).

Run in the vLLM venv (`make test-vllm`). Both engines run in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), eager, fp32, one OpenMP thread, all prompts in one batch, so
the batch shrinks as replies end and the schedule's K changes within the run.
"""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import vllm_test_engine

from dcoco.paths import checkpoints_dir
from dcoco.serving.draft_schedule import OPEN_END
from dcoco.serving.vllm.settings import SETTINGS_ENV, PluginSettings, current

TARGET = "smollm2-135m-instruct"
CHECKPOINT = "dcoco-joint-12k"  # the shipped dcoco: drafter with copy hints, corrector head
PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is 12 times 14?",
    "Name three planets.",
    "Explain in two sentences what a compiler does.",
]
MAX_TOKENS = (48, 12, 24, 36)  # different lengths: the batch shrinks 4 -> 3 -> 2 -> 1
SCHEDULE = [[1, 1, 7], [2, 2, 3], [3, 1 << 16, 0]]
ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def _generate(
    speculative: dict | None, temperatures: tuple[float, ...] = (0.0,) * len(PROMPTS)
) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    from dcoco.models.target.loading import resolve_target

    llm = vllm_test_engine(str(resolve_target(TARGET)), speculative, 8)
    try:
        messages = [[{"role": "user", "content": p}] for p in PROMPTS]
        params = [
            SamplingParams(temperature=t, max_tokens=n, ignore_eos=True, seed=i)
            for i, (t, n) in enumerate(zip(temperatures, MAX_TOKENS, strict=True))
        ]
        outputs = llm.chat(messages, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


@pytest.mark.vllm
def test_schedule_down_to_no_drafts_keeps_greedy_output_and_skips_the_drafter(monkeypatch):
    pytest.importorskip("vllm")
    from dcoco.serving.vllm import no_draft as vllm_no_draft

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    plain = _generate(None)
    before = dict(vllm_no_draft.STEPS)
    speculative = {
        "method": "dflash",
        "model": str(checkpoints_dir() / TARGET / CHECKPOINT),
        "num_speculative_tokens": 7,
        "num_speculative_tokens_per_batch_size": SCHEDULE,
    }
    scheduled = _generate(speculative)
    steps = {key: vllm_no_draft.STEPS[key] - before[key] for key in before}
    assert [len(ids) for ids in plain] == list(MAX_TOKENS)
    assert scheduled == plain
    # while 3-4 requests ran, no drafts: the drafter only stored its context (the runner's
    # shortcut: the batch shrinks, so no K = 0 step follows a drafting one), sampling was plain
    assert steps["runner_context_only"] > 0 and steps["plain_sampling"] > 0
    # at 4 requests, beyond the largest drafting batch (2) + the context margin, no context stored
    assert steps["context_skipped"] > 0
    assert steps["draft_calls_skipped"] > 0  # the engine did not ask for drafts after K = 0


@pytest.mark.vllm
def test_sampled_requests_follow_their_own_schedule(monkeypatch):
    """With the sampled schedule at 0, a batch of only sampled requests never runs the drafter's
    pass (with a greedy batch-size schedule the scheduler asks them for no drafts and their
    context is not stored), and greedy requests beside sampled ones keep plain vLLM's output."""
    pytest.importorskip("vllm")
    from dcoco.serving.vllm import no_draft as vllm_no_draft

    for key, value in {**ENV, **PluginSettings(sampled_schedule="1-:0").environment()}.items():
        monkeypatch.setenv(key, value)
    speculative = {
        "method": "dflash",
        "model": str(checkpoints_dir() / TARGET / CHECKPOINT),
        "num_speculative_tokens": 7,
    }
    temperatures = (0.0, 1.0, 0.0, 1.0)
    plain = _generate(None, temperatures)
    before = dict(vllm_no_draft.STEPS)
    mixed = _generate(speculative, temperatures)
    sampled_only = vllm_no_draft.STEPS["context_only"]
    _generate(speculative, (1.0,) * len(PROMPTS))
    sampled_only = vllm_no_draft.STEPS["context_only"] - sampled_only
    scheduled = {**speculative, "num_speculative_tokens_per_batch_size": SCHEDULE}
    before_scheduled = dict(vllm_no_draft.STEPS)
    _generate(scheduled, (1.0,) * len(PROMPTS))
    steps = {key: vllm_no_draft.STEPS[key] - before_scheduled[key] for key in before}
    assert [mixed[0], mixed[2]] == [plain[0], plain[2]]
    assert vllm_no_draft.STEPS["context_only"] - before["context_only"] >= sampled_only > 0
    assert steps["context_only"] == 0 and steps["draft_calls_skipped"] > 0
    assert steps["context_skipped"] == steps["runner_context_only"] > 0


@pytest.mark.vllm
def test_schedule_probe_times_every_cell_through_its_queue(monkeypatch):
    """The probe (dcoco.serving.vllm.schedule_probe) on a real engine, at a small scale: every
    (T, K, batch) cell gets a rate and a step time, each cell's queue is drained before the
    next, and the longest K's engine measures the draft positions' acceptance at both T."""
    pytest.importorskip("vllm")
    from dcoco.models.target.loading import resolve_target
    from dcoco.serving.vllm import schedule_probe as vllm_schedule_probe

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    request = {
        "model": str(resolve_target(TARGET)),
        "dtype": "float32",
        "max_model_len": 512,
        "kv_cache_bytes": 128 << 20,
        "speculative": {
            "method": "dflash",
            "model": str(checkpoints_dir() / TARGET / CHECKPOINT),
            "num_speculative_tokens": 3,
        },
        "draft_lengths": {"0": [0, 3], "1": [0, 3]},
        "batches": [1, 3],
        "sampled_batches": [2],
        "max_tokens": 8,
        "min_tokens": 16,
        "queue_rounds": 1,
        "passes": 2,
        "calibration": {"max_tokens": 16, "batch": 2, "min_tokens": 32},
        "head": True,  # the corrector: the drafting cells again with it off
    }
    queues, queue_rate = [], vllm_schedule_probe.queue_rate

    def recorded(engine, make_request, batch, tokens):
        k = engine.engine_core.engine_core.scheduler.dynamic_sd_lookup[batch]
        settings = current()
        head = None if settings.head_max_batch == OPEN_END else str(settings.head_max_batch)
        assert (
            settings.sampled_head_max_batch == settings.head_max_batch
        )  # in steps of any requests
        queues.append((batch, k, head))
        return queue_rate(engine, make_request, batch, tokens)

    monkeypatch.setattr(vllm_schedule_probe, "queue_rate", recorded)
    summary = vllm_schedule_probe.measure(request)
    # one engine: after the warm-up and the calibrations (at K = 3), the cells of every K, with
    # and without the head, in alternation batch by batch, the engine's K switched between them,
    # in two passes, the second the first backwards
    greedy = [(1, 0, None), (1, 3, None), (1, 3, "0"), (3, 3, "0"), (3, 3, None), (3, 0, None)]
    sampled = [(2, 0, None), (2, 3, None), (2, 3, "0")]
    assert queues[-18:] == greedy + greedy[::-1] + sampled + sampled[::-1]
    assert all(k == 3 for _, k, _ in queues[:-18])
    # the calibrations, at each T with the head and then without
    assert [head for _, _, head in queues[1:5]] == [None, None, "0", "0"]
    rates = summary["rates"]
    assert set(rates) == {"0", "1"} and set(rates["0"]) == {"0", "3"} == set(rates["1"])
    cells = [*rates["0"]["0"].values(), *rates["0"]["3"].values(), *rates["1"]["0"].values()]
    assert set(rates["0"]["3"]) == {"1", "3"} and set(rates["1"]["0"]) == {"2"}
    assert all(rate > 0 for rate in cells)
    steps = summary["step_s"]
    assert set(steps["0"]["3"]) == {"1", "3"} and all(s > 0 for s in steps["1"]["0"].values())
    # each cell's step time is its faster pass's
    passes = summary["step_s_passes"]
    for t, by_k in steps.items():
        for k, by_batch in by_k.items():
            assert all(len(passes[t][k][b]) == 2 for b in by_batch)
            assert all(by_batch[b] == min(passes[t][k][b]) for b in by_batch)
    # how often each of the 3 draft positions was accepted, at T = 0 and T = 1: rates that fall
    # along the block (a position is reached only through the ones before it)
    for temperature in ("0", "1"):
        acceptance = summary["acceptance"][temperature]
        assert len(acceptance) == 3 and 1 >= acceptance[0] >= acceptance[1] >= acceptance[2] >= 0
    assert summary["acceptance"]["0"][0] > 0.2  # the shipped drafter, greedy
    head_off = summary["head_off"]  # K = 0 drafts nothing, so only K = 3 is timed again
    assert set(head_off["step_s"]["0"]) == {"3"} and set(head_off["step_s"]["0"]["3"]) == {"1", "3"}
    assert set(head_off["step_s"]["1"]) == {"3"} and set(head_off["step_s"]["1"]["3"]) == {"2"}
    assert all(s > 0 for t in ("0", "1") for s in head_off["step_s"][t]["3"].values())
    assert all(len(head_off["acceptance"][t]) == 3 for t in ("0", "1"))
    assert head_off["acceptance"]["0"][0] > 0.2
    assert current().head_max_batch == current().sampled_head_max_batch == OPEN_END  # on again
    # the drafter model's compute_logits timed per call in every drafting cell, head on and off
    for cells in (summary["logits_s"], head_off["logits_s"]):
        assert set(cells["0"]) == {"3"} and set(cells["0"]["3"]) == {"1", "3"}  # K = 0: none
        assert set(cells["1"]["3"]) == {"2"}
        assert all(0 < s < 1 for t in ("0", "1") for s in cells[t]["3"].values())


@pytest.mark.vllm
def test_head_picks_drafts_only_up_to_its_ceiling_and_output_stays_plain(monkeypatch):
    """With the head's ceiling at 2 running requests (`@2`), the corrector runs only in steps of
    at most 2 requests; the steps above draft the drafter's own top-1. Greedy fp32 output equals
    plain vLLM's either way. With `@2/0` it never runs in steps of sampled requests only."""
    pytest.importorskip("vllm")
    from dcoco.models.heads import head_compile  # the model's HeadSelect calls select_draft there

    for key, value in {**ENV, **PluginSettings().with_schedule("1-:3@2").environment()}.items():
        monkeypatch.setenv(key, value)
    batches = []
    select = head_compile.select_draft

    def counted(head, hidden, *args):
        batches.append(hidden.shape[0])  # [requests, slots, hidden]
        return select(head, hidden, *args)

    monkeypatch.setattr(head_compile, "select_draft", counted)
    plain = _generate(None)
    speculative = {
        "method": "dflash",
        "model": str(checkpoints_dir() / TARGET / CHECKPOINT),
        "num_speculative_tokens": 3,
    }
    assert _generate(speculative) == plain
    assert batches and max(batches) == 2  # the batch shrinks 4 -> 1: the head ran at 2 and 1
    monkeypatch.setenv(
        SETTINGS_ENV, PluginSettings().with_schedule("1-:3@2/0").environment()[SETTINGS_ENV]
    )
    batches.clear()
    _generate(speculative, (1.0,) * len(PROMPTS))
    assert batches == []  # never in a step of sampled requests only
    _generate(speculative, (0.0,) + (1.0,) * (len(PROMPTS) - 1))  # the longest one greedy
    assert batches  # a step holding a greedy request keeps N


@pytest.mark.vllm
def test_runner_shortcut_stores_the_same_context_as_the_proposer_path(monkeypatch):
    """At K = 0 the runner's shortcut writes the drafter's context itself: the drafts of the
    steps that draft again afterwards equal those of vLLM's own path, token for token (fp32)."""
    pytest.importorskip("vllm")
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from dcoco.serving.vllm import no_draft as vllm_no_draft

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    vllm_no_draft.install()
    drafts: list[list[list[int]]] = []
    propose = GPUModelRunner.propose_draft_token_ids

    def recorded(self, *args, **kwargs):
        out = propose(self, *args, **kwargs)
        if isinstance(out, torch.Tensor) and out.shape[1] > 0:
            drafts.append(out.tolist())
        return out

    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", recorded)
    every_step = PluginSettings(context_margin=1 << 16)  # every K = 0 step stores the context
    monkeypatch.setenv(SETTINGS_ENV, every_step.environment()[SETTINGS_ENV])
    speculative = {
        "method": "dflash",
        "model": str(checkpoints_dir() / TARGET / CHECKPOINT),
        "num_speculative_tokens": 7,
        "num_speculative_tokens_per_batch_size": SCHEDULE,
    }
    runs = {}
    for shortcut in (True, False):
        monkeypatch.setattr(vllm_no_draft, "RUNNER_SHORTCUT", shortcut)
        before, drafts[:] = dict(vllm_no_draft.STEPS), []
        outputs = _generate(speculative)
        steps = {key: vllm_no_draft.STEPS[key] - before[key] for key in before}
        runs[shortcut] = (outputs, [list(d) for d in drafts], steps)
    (fast, fast_drafts, fast_steps), (slow, slow_drafts, slow_steps) = runs[True], runs[False]
    assert fast_steps["runner_context_only"] > 0 and slow_steps["runner_context_only"] == 0
    assert fast_steps["context_skipped"] == 0
    assert slow_steps["context_only"] > 0
    assert fast == slow
    assert len(fast_drafts) > 0 and fast_drafts == slow_drafts
