"""Load-aware drafting: how many draft tokens a served request gets, by how many are running.

On a loaded CPU a verify of K + 1 tokens per request costs more than the tokens it wins (vLLM-CPU,
8 streams: every drafter below plain). vLLM 0.32's scheduler takes a batch-size schedule,
`num_speculative_tokens_per_batch_size` = [(first, last, K), ...], and asks the proposer for K
draft tokens per request each step by the number of requests scheduled (K = 0: no drafts; our
plugin then skips the drafter's pass but keeps its context, dcoco.serving.vllm_no_draft).

Sampled requests are accepted less often, so they get a schedule of their own, which our plugin
applies per request (dcoco.serving.vllm_sampled_drafts); it never drafts more than the greedy one.

`dcoco serve --draft-schedule` takes
- `auto` (the default): measured once per machine, method, precision and prompts
  (dcoco.serving.vllm_schedule_probe: the time of a step at a few K per batch size, greedy at
  T = 0, sampled at T = 1, and how often each draft position is accepted on the prompts) and
  cached under `$DCOCO_CACHE_DIR/serve-schedules/`; each measured batch size gets the shortest K
  whose predicted tokens/s is within 2% of its fastest (dcoco.serving.schedule_choice), a size
  between two measured ones the smaller of their K;
- `fixed`: vLLM's own behaviour, `--num-speculative-tokens` at every load;
- a schedule written out, `GREEDY[/SAMPLED][@N]`: `1:7,2-3:5,4-7:3,8-:0/1:2,2-:0@4` (batch
  sizes: K; the last range may stay open; without `/SAMPLED` sampled requests follow the greedy
  one; `@N`: a draft head picks the drafts only while at most N requests run, above that the
  drafter's own top-1 does, dcoco.serving.head_ceiling; `auto` measures N for a head method).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dcoco.errors import DcocoError
from dcoco.paths import cache_dir

OPEN_END = 1 << 16  # the last range's end: vLLM clamps it to its max_num_seqs
# the draft lengths timed (and the drafter's longest); the ones between are interpolated
# (dcoco.serving.schedule_choice)
PROBE_DRAFT_LENGTHS = (0, 2, 4, 7)
PROBE_BATCHES = (1, 2, 4, 8, 16, 32)
PROBE_SAMPLED_DRAFT_LENGTHS = (0, 2, 4)  # at T = 1 short drafts or none win, if any
PROBE_SAMPLED_BATCHES = (1, 2, 4)  # beyond these the greedy schedule already drafts little
PROBE_TOKENS = 48  # tokens per request in the probe's queue
PROBE_MIN_TOKENS = 256  # a timed cell runs until its requests have produced at least this many,
PROBE_QUEUE_ROUNDS = 1  # and at least this many times batch size x PROBE_TOKENS
# How often each draft position is accepted: requests of up to CALIBRATION_TOKENS tokens, replies
# to their end, CALIBRATION_BATCH in flight, until they have produced CALIBRATION_MIN_TOKENS.
CALIBRATION_TOKENS, CALIBRATION_BATCH, CALIBRATION_MIN_TOKENS = 128, 4, 2048
PROBE_VERSION = 5  # bump when the probe measures differently: cached schedules are redone

# carries the sampled schedule to the plugin in vLLM's processes (dcoco.serving.vllm_sampled_drafts)
SCHEDULE_ENV = "DCOCO_SAMPLED_DRAFT_SCHEDULE"  # e.g. `1:2,2-:0`; unset: sampled = greedy
# carries `dcoco serve --k0-context-margin` to the plugin (dcoco.serving.vllm_no_draft)
CONTEXT_MARGIN_ENV = "DCOCO_K0_CONTEXT_MARGIN"

Schedule = list[tuple[int, int, int]]  # (first batch size, last batch size, K)


def parse(text: str, max_k: int) -> Schedule:
    """`1:7,2-3:5,8-:0` -> [(1, 1, 7), (2, 3, 5), (8, OPEN_END, 0)], checked."""
    schedule = []
    for item in text.split(","):
        sizes, sep, k = item.strip().partition(":")
        first, dash, last = sizes.partition("-")
        try:
            entry = (int(first), int(last) if last else OPEN_END if dash else int(first), int(k))
        except ValueError:
            raise DcocoError(
                f"draft schedule item '{item}' is not SIZE:K or FIRST-LAST:K or FIRST-:K"
            ) from None
        if not sep or entry[0] < 1 or entry[1] < entry[0] or not 0 <= entry[2] <= max_k:
            raise DcocoError(
                f"draft schedule item '{item}': sizes must be >= 1 and ascending, K in 0..{max_k}"
            )
        schedule.append(entry)
    schedule.sort()
    if schedule[0][0] != 1:
        raise DcocoError("a draft schedule must start at batch size 1")
    for (_, last, _), (first, _, _) in zip(schedule, schedule[1:], strict=False):
        if first <= last:
            raise DcocoError("draft schedule ranges overlap")
    return schedule


def parse_pair(text: str, max_k: int) -> tuple[Schedule, Schedule | None]:
    """`GREEDY[/SAMPLED][@N]` -> (greedy schedule, sampled schedule or None); N is checked."""
    from dcoco.serving.head_ceiling import split

    greedy, _, sampled = split(text)[0].partition("/")
    return parse(greedy, max_k), parse(sampled, max_k) if sampled else None


def k_at(schedule: Schedule, batch_size: int) -> int:
    for first, last, k in schedule:
        if first <= batch_size <= last:
            return k
    return schedule[-1][2]


def largest_drafting_batch(schedule: Schedule) -> int:
    """The largest batch size given drafts (OPEN_END: every size from some on; 0: none)."""
    return max((last for _, last, k in schedule if k > 0), default=0)


def at_most(sampled: Schedule, greedy: Schedule) -> Schedule:
    """The sampled schedule with no batch size drafting more than the greedy one does."""
    bounds = sorted({first for first, _, _ in sampled + greedy})
    dense = [(b, b, min(k_at(sampled, b), k_at(greedy, b))) for b in range(1, bounds[-1] + 1)]
    return merged_ranges([*dense[:-1], (dense[-1][0], OPEN_END, dense[-1][2])])


def format_schedule(schedule: Schedule) -> str:
    def sizes(first: int, last: int) -> str:
        if first == last:
            return str(first)
        return f"{first}-" if last >= OPEN_END else f"{first}-{last}"

    return ",".join(f"{sizes(first, last)}:{k}" for first, last, k in schedule)


def merged_ranges(schedule: Schedule) -> Schedule:
    out: Schedule = []
    for first, last, k in schedule:
        if out and out[-1][2] == k and out[-1][1] + 1 == first:
            out[-1] = (out[-1][0], last, k)
        else:
            out.append((first, last, k))
    return out


def for_server(python: str, probe: dict, layout: str, prompts_file: str = "") -> str:
    """The `GREEDY/SAMPLED` schedule measured for a server with process `layout` (the worker gets
    every core with `all-cores`, all but one otherwise), timed on the first turns of
    `prompts_file` (suite records, as `dcoco bench-serve --prompts` reads) or the probe's own."""
    from dcoco.decode.cost_curve import machine_fingerprint

    cores = len(os.sched_getaffinity(0))
    threads = cores if layout == "all-cores" else max(1, cores - 1)
    key = {**machine_fingerprint(), "probe": probe, "layout": layout, "threads": threads}
    if prompts_file:
        probe = {**probe, "prompts": probe_prompts(prompts_file)}
        key["prompts"] = hashlib.sha256(json.dumps(probe["prompts"]).encode()).hexdigest()[:16]
    text, _ = measured(python, probe, key, threads)
    return text


def probe_prompts(prompts_file: str) -> list[str]:
    """The first turns of a JSONL of suite records, for the probe's queue."""
    from dcoco.eval.suites import read_suite_file

    file = Path(prompts_file)
    if not file.is_file():
        raise DcocoError(f"schedule prompts file not found: {prompts_file}")
    texts = [prompt.turns[0] for prompt in read_suite_file(file, default_suite=file.stem)]
    if not texts:
        raise DcocoError(f"{prompts_file} holds no prompts")
    return texts


def schedule_env(text: str) -> dict[str, str]:
    """What the plugin in vLLM's processes takes from `GREEDY/SAMPLED@N`, as their environment: the
    sampled requests' schedule (dcoco.serving.vllm_sampled_drafts) and the head's ceiling N."""
    from dcoco.serving.head_ceiling import HEAD_ENV, split

    pair, ceiling = split(text)
    _, _, sampled = pair.partition("/")
    env = {SCHEDULE_ENV: sampled} if sampled else {}
    return env if ceiling >= OPEN_END else {**env, HEAD_ENV: str(ceiling)}


def measured(python: str, probe: dict, key: dict, threads: int) -> tuple[str, dict]:
    """(`GREEDY/SAMPLED[@N]` schedules, the probe's record) for the served method `probe`
    describes (model, dtype, speculative config, max_model_len, kv_cache_bytes), cached by `key`."""
    record_key = {**key, "probe_version": PROBE_VERSION}
    digest = hashlib.sha256(json.dumps(record_key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "serve-schedules" / f"{digest}.json"
    if path.is_file():
        try:
            record = json.loads(path.read_text())
            parse_pair(record["schedule"], OPEN_END)  # a damaged record is measured again
            return record["schedule"], record
        except (ValueError, KeyError, TypeError, DcocoError):
            pass  # measured again below
    print("dcoco: measuring the draft schedule (once per machine and method)", file=sys.stderr)
    from dcoco.serving.schedule_choice import schedule_from

    summary = _run_probe(python, _probe_request(probe), threads)
    schedule, rates = schedule_from(summary)
    record = {
        "schedule": schedule,
        "tokens_per_s": rates,  # b x tau(K) / step(b, K), what the schedule was chosen from
        "measured_tokens_per_s": summary["rates"],  # at the probe's own acceptance
        "step_s": summary["step_s"],
        "acceptance": summary["acceptance"],
        "head_off": summary.get("head_off"),  # greedy, the drafter's own top-1 (head methods)
        "key": record_key,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return schedule, record


def _probe_request(probe: dict) -> dict:
    from dcoco.serving.head_ceiling import has_head

    max_k = probe["speculative"]["num_speculative_tokens"]
    return {
        **probe,
        "draft_lengths": {
            "0": sorted({k for k in PROBE_DRAFT_LENGTHS if k < max_k} | {max_k}),
            "1": [k for k in PROBE_SAMPLED_DRAFT_LENGTHS if k <= max_k],
        },
        "batches": list(PROBE_BATCHES),
        "sampled_batches": list(PROBE_SAMPLED_BATCHES),
        "max_tokens": PROBE_TOKENS,
        "min_tokens": PROBE_MIN_TOKENS,
        "queue_rounds": PROBE_QUEUE_ROUNDS,
        "calibration": {
            "max_tokens": CALIBRATION_TOKENS,
            "batch": CALIBRATION_BATCH,
            "min_tokens": CALIBRATION_MIN_TOKENS,
        },
        "head": has_head(probe["speculative"].get("model", "")),  # also timed without it
    }


def _run_probe(python: str, request: dict, threads: int) -> dict:
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the worker in the probe's own process
        "OMP_NUM_THREADS": str(threads),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    with tempfile.TemporaryDirectory(prefix="dcoco-schedule-") as tmp:
        request_file, summary_file = Path(tmp) / "request.json", Path(tmp) / "summary.json"
        request_file.write_text(json.dumps({**request, "summary": str(summary_file)}))
        log = cache_dir() / "serve-schedules" / "probe.log"  # a file: a pipe would fill up
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as sink:
            done = subprocess.run(
                [python, "-m", "dcoco.serving.vllm_schedule_probe", str(request_file)],
                env=env,
                stdout=sink,
                stderr=sink,
            )
        if done.returncode != 0 or not summary_file.is_file():
            tail = log.read_text(errors="replace")[-2000:]
            raise DcocoError(f"the draft-schedule probe failed (log {log}):\n{tail}")
        return json.loads(summary_file.read_text())
