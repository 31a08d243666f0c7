"""A queue of requests kept in flight on an offline vLLM engine, timed: how the draft-schedule
probe (dcoco.serving.vllm.schedule_probe) and the reproduce scripts measure a loaded server's
speed at one batch size, and read vLLM's speculative counters."""

from __future__ import annotations

import itertools
import time

_REQUEST_IDS = itertools.count()  # unique across cells: vLLM keys requests by id


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
