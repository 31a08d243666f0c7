"""The vLLM side of `dcoco serve --draft-schedule auto`, run by the vLLM interpreter:
`python -m dcoco.serving.vllm.schedule_probe REQUEST.json`.

A served method's speed at K drafts and b running requests is b x τ(K) / step(b, K): what a step
costs, which depends on the machine and the method, times how many tokens it yields, which
depends on the traffic. The probe measures the two apart (version 4), since a short timed run
measures their product noisily and at the probe's own acceptance:
- **step(b, K)**: one offline vLLM engine (this process, so the numbers are the worker's alone)
  serves the method, its K switched between cells (`_set_drafts`), and times each batch size b
  the way a loaded server runs it: a queue keeps b chat requests in flight (greedy at T = 0,
  sampled at T = 1, a fixed seed per request), each running `max_tokens` tokens with EOS ignored,
  a finished request replaced at once (a batch started together would wait for its slowest
  request at ever smaller sizes). Timed from the first completion until max(`min_tokens`,
  `queue_rounds` x b x `max_tokens`) more tokens came out: step(b, K) is that time over the
  engine steps taken; the cell's tokens/s is kept too. At each b the cells of every K (and the
  head off, below) are timed in alternation (`cell_order`), after a warm-up serving every prompt
  once. Versions 5 and 6 gave each K an engine of its own, minutes apart (5 also timed every cell
  with the head before any without), and the machine's drift between them (an engine also speeds
  up over its first cells: prefix cache, memory) moved schedules from one probe to the next.
  Every cell is timed in `passes` passes, each pass the previous one's order reversed, and keeps
  its fastest (version 9): a busy machine only ever slows a cell, and on a noisy VM (Intel Xeon
  model 207, 2026-12-05) one pass's cells were off by up to 40%, so two probes of one method chose
  different schedules. Every pass's step times are kept too (`step_s_passes`).
- **the head's own cost** (version 10): a head's cell and its head-off twin differ by a few ms in
  steps of 30-300 ms, less than one pass's noise there, so which of the two a schedule kept was
  chance (both version-9 `dcoco` probes: the corrector off for every greedy step and on for
  every sampled one). Every drafting cell also times the drafter model's `compute_logits` per
  call (`logits_s`: the head's pick, or the drafter's own top-1), and the schedule reads a head's
  step as its head-off twin's plus the difference (dcoco.serving.schedule_choice).
- **τ(K)**: at the longest K, before any cell, `calibration` requests (replies to their end, up
  to its `max_tokens`) at T = 0 and T = 1 give how often each draft position is accepted; a block
  drafter's first K drafts do not depend on how many more it drafts, so τ(K) = 1 + the sum of the
  first K positions' rates.
- **head off** (a drafter with a draft head): every drafting cell and each T's acceptance again
  with the head switched off (the plugin's settings' head ceilings = 0, read at every step by
  dcoco.serving.head_ceiling), the drafter's own top-1 drafting; the schedule keeps the head up to
  the batch size where it stops paying, greedy and sampled apart (version 8; 7 timed greedy cells
  only).
Prompts: the request's (`dcoco serve --schedule-prompts`) or ours. The measurements go to the
request's `summary` file (JSON; vLLM logs to stdout) for dcoco.serving.draft_schedule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path

from dcoco.serving.probe_progress import ProbeProgress
from dcoco.serving.probe_prompts import PROMPTS
from dcoco.serving.vllm.engine_queue import queue_rate, spec_counts
from dcoco.serving.vllm.no_draft import set_runner_schedule
from dcoco.serving.vllm.settings import current, use

# what each timed cell gives, by T, K, batch (logits_s: seconds a compute_logits call, K > 0)
CELL_FIELDS = ("rates", "step_s", "step_s_passes", "logits_s")


def measure(request: dict) -> dict:
    """Per temperature T, draft length K and batch size b: {"rates": {T: {K: {b: tokens/s}}},
    "step_s": {T: {K: {b: seconds a step}}}, "step_s_passes": {T: {K: {b: [seconds a step, one
    per pass]}}}, "acceptance": {T: [rate of draft position 1, ...]}},
    with a draft head also "head_off": {"rates": {T: {K: {b: ..}}}, "step_s": .., "acceptance":
    {T: [..]}} (K > 0). One engine serves every cell (`_set_drafts` switches K between them)."""
    import vllm
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    lengths = request["draft_lengths"]  # {T: [K, ...]}
    top = max(k for ks in lengths.values() for k in ks)
    head = bool(request.get("head")) and top > 0 and "0" in lengths
    summary: dict = {"vllm": vllm.__version__, "acceptance": {}, **{n: {} for n in CELL_FIELDS}}
    head_off: dict = {"acceptance": {}, **{name: {} for name in CELL_FIELDS}}
    llm = _engine(request, top)
    try:
        prompts = _chat_prompts(llm, request)
        _warm_up(llm, request, prompts)  # at the longest K: every prompt's drafter context kept
        # calibrated before any cell at K = 0, whose steps may not store the drafter's context
        summary["acceptance"] = {t: _acceptance(llm, request, prompts, float(t)) for t in lengths}
        if head:
            with _head_switched_off():
                head_off["acceptance"] = {
                    t: _acceptance(llm, request, prompts, float(t)) for t in lengths
                }
        groups = {t: [(k, True) for k in ks] + [(k, False) for k in ks if k > 0 and head]
                  for t, ks in lengths.items()}  # fmt: skip
        progress = ProbeProgress(sum(_work(request, t, len(v)) for t, v in groups.items()))
        for t, variants in groups.items():
            timed = _time_cells(llm, request, prompts, t, variants, progress)
            for (k, head_on), cell in timed:
                into = summary if head_on else head_off
                for name, values in zip(CELL_FIELDS, cell, strict=True):
                    if values:  # K = 0 calls no compute_logits
                        into[name].setdefault(t, {})[str(k)] = values
                label = "" if head_on else " without head"
                print(f"dcoco: T={t}{label} K={k}: {cell}", file=sys.stderr, flush=True)
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
    if head_off["step_s"]:
        summary["head_off"] = head_off
    return summary


def _engine(request: dict, k: int):
    from vllm import LLM

    speculative = {
        **request["speculative"],
        "num_speculative_tokens_per_batch_size": [[1, 1 << 16, k]],
    }
    return LLM(
        model=request["model"],
        dtype=request["dtype"],
        max_model_len=request["max_model_len"],
        enforce_eager=True,
        kv_cache_memory_bytes=request["kv_cache_bytes"],
        speculative_config=speculative,
        max_num_seqs=_max_batch(request),
        seed=0,
        disable_log_stats=False,  # the acceptance counters; a served engine keeps them too
    )


def _max_batch(request: dict) -> int:
    return max(request["batches"] + request["sampled_batches"])


def _chat_prompts(llm, request: dict) -> list:
    tokenizer = llm.get_tokenizer()
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,  # token ids, not transformers 5's BatchEncoding
        )
        for p in request.get("prompts") or PROMPTS
    ]


def _set_drafts(llm, k: int) -> None:
    """From the next step on, every batch size drafts `k`, as in an engine started with the
    schedule `1-:k`: the scheduler's batch size -> K table, and the runner's limit for storing
    the drafter's context in steps without drafts (dcoco.serving.vllm.no_draft), made again."""
    engine = llm.llm_engine  # the engine core and the worker are in this process
    lookup = engine.engine_core.engine_core.scheduler.dynamic_sd_lookup
    lookup[:] = [k] * len(lookup)
    set_runner_schedule(engine.model_executor.driver_worker.worker.model_runner, [[1, 1 << 16, k]])


@contextlib.contextmanager
def _head_switched_off():
    """The plugin's draft head off for what runs inside (the engine is in this process), in
    steps of any requests."""
    before = current()
    use(dataclasses.replace(before, head_max_batch=0, sampled_head_max_batch=0))
    try:
        yield
    finally:
        use(before)


def _params(request: dict, temperature: float, seed: int, ignore_eos: bool = True):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=temperature,
        max_tokens=request["max_tokens"],
        ignore_eos=ignore_eos,
        seed=seed,
        output_kind=RequestOutputKind.DELTA,  # each step reports only its new tokens
    )


def _warm_up(llm, request: dict, prompts: list) -> None:
    """Every prompt served once (greedy, a few tokens), so no timed cell pays a first prefill."""
    warm = {**request, "max_tokens": min(8, request["max_tokens"])}
    batch = min(8, len(prompts), _max_batch(request))
    queue_rate(
        llm.llm_engine,
        lambda i: ({"prompt_token_ids": prompts[i % len(prompts)]}, _params(warm, 0.0, i)),
        batch,
        len(prompts) * warm["max_tokens"],
    )


def cell_order(batches: list[int], labels: list, passes: int = 1) -> list[tuple[int, object]]:
    """The (batch, variant) cells in the order they are timed: batch by batch, each variant once,
    the variants' order reversed at every other batch size, so drift hits them alike; each further
    pass runs the previous one backwards (A B B A), so a drift over the whole probe hits every
    cell's passes alike too."""
    one_pass = [
        (batch, label)
        for n, batch in enumerate(batches)
        for label in (labels if n % 2 == 0 else labels[::-1])
    ]
    return [cell for n in range(passes) for cell in (one_pass if n % 2 == 0 else one_pass[::-1])]


def _batches(request: dict, temperature: str) -> list[int]:
    return request["batches"] if temperature == "0" else request["sampled_batches"]


def _cell_tokens(request: dict, batch: int) -> int:
    """Tokens a cell at `batch` times (its cost, near enough, for the estimate)."""
    return max(request["min_tokens"], request["queue_rounds"] * batch * request["max_tokens"])


def _work(request: dict, temperature: str, variants: int) -> int:
    """Tokens every cell at `temperature` times, over all passes."""
    per_pass = sum(_cell_tokens(request, b) for b in _batches(request, temperature))
    return per_pass * variants * request.get("passes", 1)


def _time_cells(llm, request: dict, prompts: list, temperature: str, variants: list, progress):
    """[((K, head on), ({batch: tokens/s}, {batch: seconds a step}, {batch: [seconds a step per
    pass]}, {batch: seconds a compute_logits call})), ...] (CELL_FIELDS): this engine's queue at
    each batch size and each variant, the variants timed in alternation (`cell_order`), each
    cell's fastest pass kept (its rate and calls with it). `progress`: told each cell's tokens."""
    batches = _batches(request, temperature)
    cells: dict = {variant: ({}, {}, {}, {}) for variant in variants}
    for batch, (k, head_on) in cell_order(batches, variants, request.get("passes", 1)):
        tokens = _cell_tokens(request, batch)
        _set_drafts(llm, k)
        head = contextlib.nullcontext() if head_on else _head_switched_off()
        with head, _timed_logits() as spent:
            rate, step = queue_rate(
                llm.llm_engine,
                lambda i: (
                    {"prompt_token_ids": prompts[i % len(prompts)]},
                    _params(request, float(temperature), i),
                ),  # fmt: skip
                batch,
                tokens,
            )
        rates, step_s, passes, logits_s = cells[(k, head_on)]
        passes.setdefault(str(batch), []).append(round(step, 6))
        if step <= step_s.get(str(batch), step):
            rates[str(batch)], step_s[str(batch)] = round(rate, 2), round(step, 6)
            if spent[1]:
                logits_s[str(batch)] = round(spent[0] / spent[1], 7)
        progress.add(tokens)
    return list(cells.items())


@contextlib.contextmanager
def _timed_logits():
    """[seconds, calls] of the served drafter model's draft pick (the draft head's, or the
    drafter's own top-1) while inside: `get_top_tokens`, or `compute_logits` where vLLM takes the
    argmax itself; the model runs in this process."""
    from dcoco.serving.vllm.model import DcocoDFlashForCausalLM as Model

    spent = [0.0, 0]
    originals = {name: getattr(Model, name) for name in ("compute_logits", "get_top_tokens")}

    def timer(original):
        def timed(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started
                spent[1] += 1

        return timed

    for name, original in originals.items():
        setattr(Model, name, timer(original))
    try:
        yield spent
    finally:
        for name, original in originals.items():
            setattr(Model, name, original)


def _acceptance(llm, request: dict, prompts: list, temperature: float) -> list[float]:
    """How often each draft position was accepted (per draft), over the calibration requests:
    replies run to their end (or the calibration's `max_tokens`), at T = `temperature`."""
    calibration = request["calibration"]
    drafts, accepted = spec_counts(llm)
    queue_rate(
        llm.llm_engine,
        lambda i: (
            {"prompt_token_ids": prompts[i % len(prompts)]},
            _params(calibration, temperature, i, ignore_eos=False),
        ),  # fmt: skip
        calibration["batch"],
        calibration["min_tokens"],
    )
    drafts_after, accepted_after = spec_counts(llm)
    new_drafts = max(1, drafts_after - drafts)
    return [round((a - b) / new_drafts, 4) for a, b in zip(accepted_after, accepted, strict=True)]


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    summary = measure(request)
    Path(request["summary"]).write_text(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
