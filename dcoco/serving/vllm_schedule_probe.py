"""The vLLM side of `dcoco serve --draft-schedule auto`, run by the vLLM interpreter:
`python -m dcoco.serving.vllm_schedule_probe REQUEST.json`.

A served method's speed at K drafts and b running requests is b x τ(K) / step(b, K): what a step
costs, which depends on the machine and the method, times how many tokens it yields, which
depends on the traffic. The probe measures the two apart (version 4), since a short timed run
measures their product noisily and at the probe's own acceptance:
- **step(b, K)**: for each draft length K of the request, one offline vLLM engine (this process,
  so the numbers are the worker's alone) serves the method with every batch size scheduled at K,
  and times each batch size b the way a loaded server runs it: a queue keeps b chat requests in
  flight (greedy at T = 0, sampled at T = 1, a fixed seed per request), each running
  `max_tokens` tokens with EOS ignored, a finished request replaced at once (a batch started
  together would wait for its slowest request at ever smaller sizes). Timed from the first
  completion until max(`min_tokens`, `queue_rounds` x b x `max_tokens`) more tokens came out:
  step(b, K) is that time over the engine steps taken; the cell's tokens/s is kept too.
- **τ(K)**: in the engine with the longest K, `calibration` requests (replies to their end, up to
  its `max_tokens`) at T = 0 and T = 1 give how often each draft position is accepted; a block
  drafter's first K drafts do not depend on how many more it drafts, so τ(K) = 1 + the sum of the
  first K positions' rates.
- **head off** (a drafter with a draft head, version 5): the greedy cells and the T = 0 acceptance
  again with the head switched off (dcoco.serving.head_ceiling.HEAD_ENV = 0, read at every step),
  the drafter's own top-1 drafting; the schedule then keeps the head up to the batch size where
  it stops paying. Version 6 times the two in alternation, batch by batch (`cell_order`), after
  a warm-up serving every prompt once: an engine speeds up over its first cells (prefix cache,
  memory), and version 5, every cell with the head before any without, read that as the head's
  cost (10-15% at 8 requests in one engine on an Intel Xeon, 2 cores).
Prompts: the request's (`dcoco serve --schedule-prompts`) or ours. The measurements go to the
request's `summary` file (JSON; vLLM logs to stdout) for dcoco.serving.draft_schedule.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import sys
import time
from pathlib import Path

from dcoco.serving.draft_schedule import HEAD_ENV

# Our own prompts (no benchmark suite's): code, arithmetic, explanation and chat, so the probe's
# acceptance is a mix like a server's. `dcoco serve --schedule-prompts` replaces them with a
# sample of the server's own traffic: how often drafts are accepted decides where drafting pays.
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is 17 times 23? Show the steps.",
    "Explain what a hash table is to a beginner.",
    "Give me three ideas for a rainy weekend.",
    "Write a SQL query that counts orders per customer.",
    "A train travels 60 km in 45 minutes. What is its speed in km/h?",
    "Summarise the water cycle in a few sentences.",
    "Write a short poem about autumn leaves.",
    "Write a JavaScript function that removes duplicates from an array.",
    "If a shirt costs 25 dollars after a 20% discount, what was the original price?",
    "What are the main differences between TCP and UDP?",
    "Suggest a name for a coffee shop and explain it.",
    "Write a bash command that finds the ten largest files in a directory.",
    "Sam has 3 boxes of 12 pencils and gives away 7. How many are left?",
    "Why is the sky blue?",
    "Write a polite email declining a meeting invitation.",
    "Implement binary search in Python.",
    "What is the sum of the integers from 1 to 100?",
    "Explain recursion with an example.",
    "List five healthy breakfast options.",
    "Write a Python class for a simple bank account.",
    "A rectangle is 8 cm by 5 cm. What are its area and perimeter?",
    "How does a vaccine train the immune system?",
    "Write a haiku about the sea.",
    "Write a function in C that reverses a string in place.",
    "Convert 98.6 degrees Fahrenheit to Celsius.",
    "What causes the seasons on Earth?",
    "Give tips for learning a new language.",
    "Write a Python script that reads a CSV file and prints each row.",
    "A recipe needs 3 eggs for 4 people. How many eggs for 10 people?",
    "Describe how photosynthesis works.",
    "Plan a one-day trip to a city you like.",
)
HEAD_OFF = "0 without head"  # the cells' key for the greedy cells timed with the head off
_REQUEST_IDS = itertools.count()  # unique across cells: vLLM keys requests by id


def measure(request: dict) -> dict:
    """Per temperature T, draft length K and batch size b: {"rates": {T: {K: {b: tokens/s}}},
    "step_s": {T: {K: {b: seconds a step}}}, "acceptance": {T: [rate of draft position 1, ...]}},
    with a draft head also "head_off": {"rates": {K: {b: ..}}, "step_s": .., "acceptance": [..]}
    (greedy)."""
    import vllm

    summary: dict = {"vllm": vllm.__version__, "rates": {}, "step_s": {}, "acceptance": {}}
    head_off: dict = {"rates": {}, "step_s": {}, "acceptance": []}
    lengths = sorted({k for ks in request["draft_lengths"].values() for k in ks})
    for k in lengths:
        temperatures = [t for t, ks in request["draft_lengths"].items() if k in ks]
        calibrate = list(request["draft_lengths"]) if k == lengths[-1] else []
        cells, acceptance = _one_engine(request, k, temperatures, calibrate)
        for temperature, (rates, step_s) in cells.items():
            if temperature == HEAD_OFF:
                head_off["rates"][str(k)], head_off["step_s"][str(k)] = rates, step_s
            else:
                summary["rates"].setdefault(temperature, {})[str(k)] = rates
                summary["step_s"].setdefault(temperature, {})[str(k)] = step_s
            print(f"dcoco: T={temperature} K={k}: {rates}", file=sys.stderr, flush=True)
        head_off["acceptance"] = acceptance.pop(HEAD_OFF, head_off["acceptance"])
        summary["acceptance"].update(acceptance)
    if head_off["step_s"]:
        summary["head_off"] = head_off
    return summary


def _one_engine(request: dict, k: int, temperatures: list[str], calibrate: list[str]):
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    speculative = {
        **request["speculative"],
        "num_speculative_tokens_per_batch_size": [[1, 1 << 16, k]],
    }
    llm = LLM(
        model=request["model"],
        dtype=request["dtype"],
        max_model_len=request["max_model_len"],
        enforce_eager=True,
        kv_cache_memory_bytes=request["kv_cache_bytes"],
        speculative_config=speculative,
        max_num_seqs=max(request["batches"] + request["sampled_batches"]),
        seed=0,
        disable_log_stats=False,  # the acceptance counters; a served engine keeps them too
    )
    try:
        tokenizer = llm.get_tokenizer()
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,  # token ids, not transformers 5's BatchEncoding
            )
            for p in request.get("prompts") or PROMPTS
        ]
        _warm_up(llm, request, prompts)
        head_off = bool(request.get("head")) and k > 0 and "0" in temperatures
        cells = {}
        for t in temperatures:
            variants = {t: contextlib.nullcontext, HEAD_OFF: _head_switched_off}
            if not (head_off and t == "0"):
                del variants[HEAD_OFF]
            cells.update(_time_batches(llm, request, prompts, float(t), variants))
        acceptance = {t: _acceptance(llm, request, prompts, float(t)) for t in calibrate}
        if head_off and "0" in calibrate:
            with _head_switched_off():
                acceptance[HEAD_OFF] = _acceptance(llm, request, prompts, 0.0)
        return cells, acceptance
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


@contextlib.contextmanager
def _head_switched_off():
    """The plugin's draft head off for what runs inside (the engine is in this process)."""
    before = os.environ.get(HEAD_ENV)
    os.environ[HEAD_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[HEAD_ENV]
        else:
            os.environ[HEAD_ENV] = before


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
    batch = min(8, len(prompts))
    queue_rate(
        llm.llm_engine,
        lambda i: ({"prompt_token_ids": prompts[i % len(prompts)]}, _params(warm, 0.0, i)),
        batch,
        len(prompts) * warm["max_tokens"],
    )


def cell_order(batches: list[int], labels: list[str]) -> list[tuple[int, str]]:
    """The (batch, variant) cells in the order they are timed: batch by batch, each variant once,
    the variants' order reversed at every other batch size, so drift hits them alike."""
    return [
        (batch, label)
        for n, batch in enumerate(batches)
        for label in (labels if n % 2 == 0 else labels[::-1])
    ]


def _time_batches(llm, request: dict, prompts: list, temperature: float, variants: dict) -> dict:
    """{variant: ({batch: tokens/s}, {batch: seconds a step})} of this engine's queue at each
    batch size, each variant (a label -> a context manager to time it in) in alternation."""
    batches = request["batches"] if temperature == 0 else request["sampled_batches"]
    cells: dict = {label: ({}, {}) for label in variants}
    for batch, label in cell_order(batches, list(variants)):
        tokens = max(request["min_tokens"], request["queue_rounds"] * batch * request["max_tokens"])
        with variants[label]():
            rate, step = queue_rate(
                llm.llm_engine,
                lambda i: (
                    {"prompt_token_ids": prompts[i % len(prompts)]},
                    _params(request, temperature, i),
                ),  # fmt: skip
                batch,
                tokens,
            )
        rates, step_s = cells[label]
        rates[str(batch)], step_s[str(batch)] = round(rate, 2), round(step, 6)
    return cells


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


def spec_counts(llm) -> tuple[int, list[int]]:
    """vLLM's speculative counters so far (`disable_log_stats=False`): (drafts, accepted tokens
    per draft position)."""
    metrics = {m.name: m for m in llm.get_metrics()}
    per_position = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    return metrics["vllm:spec_decode_num_drafts"].value, list(per_position)


def queue_rate(engine, make_request, batch: int, tokens: int) -> tuple[float, float]:
    """(tokens/s, seconds a step) of `engine` (vLLM's LLMEngine: add_request, step,
    abort_request) with `batch` requests kept in flight, `make_request(i)` -> (prompt, params)
    the i-th of them; timed from the first completion until `tokens` more tokens came out; what
    is still running is aborted."""
    running: set[str] = set()

    def submit(i: int) -> None:
        request_id = f"q{next(_REQUEST_IDS)}"
        engine.add_request(request_id, *make_request(i))
        running.add(request_id)

    for i in range(batch):
        submit(i)
    submitted, produced, steps, started = batch, 0, 0, None
    while started is None or produced < tokens:
        outputs = engine.step()
        if started is not None:
            produced += sum(len(output.outputs[0].token_ids) for output in outputs)
            steps += 1
        for output in (output for output in outputs if output.finished):
            running.discard(output.request_id)
            submit(submitted)
            submitted += 1
        if started is None and submitted > batch:  # the first completion: staggered from here
            started = time.perf_counter()
    elapsed = time.perf_counter() - started
    engine.abort_request(sorted(running))
    while engine.has_unfinished_requests():  # let the aborts land before the next cell
        engine.step()
    return produced / elapsed, elapsed / steps


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    summary = measure(request)
    Path(request["summary"]).write_text(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
