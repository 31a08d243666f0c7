"""The `auto` draft schedule of `dcoco serve`: the probe run once per machine, method, precision
and prompts in the vLLM interpreter (dcoco.serving.vllm.schedule_probe), its record cached under
`$DCOCO_CACHE_DIR/serve-schedules/`, the schedule chosen from it (dcoco.serving.schedule_choice)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dcoco.errors import DcocoError
from dcoco.models.heads.head_io import head_kind_of
from dcoco.paths import cache_dir
from dcoco.serving.draft_schedule import OPEN_END, parse_pair
from dcoco.serving.probe_progress import follow
from dcoco.serving.schedule_choice import schedule_from

# the draft lengths timed (and the drafter's longest); the ones between are interpolated
# (dcoco.serving.schedule_choice)
PROBE_DRAFT_LENGTHS = (0, 2, 4, 7)
PROBE_BATCHES = (1, 2, 4, 8, 16, 32)
PROBE_SAMPLED_DRAFT_LENGTHS = (0, 2, 4)  # at T = 1 short drafts or none win, if any
PROBE_SAMPLED_BATCHES = (1, 2, 4, 8)  # beyond the largest, sampled requests draft nothing
PROBE_TOKENS = 48  # tokens per request in the probe's queue
PROBE_MIN_TOKENS = 256  # a timed cell runs until its requests have produced at least this many,
PROBE_QUEUE_ROUNDS = 1  # and at least this many times batch size x PROBE_TOKENS
PROBE_PASSES = 2  # every cell timed this often, the passes in mirrored order, its fastest kept
# How often each draft position is accepted: requests of up to CALIBRATION_TOKENS tokens, replies
# to their end, CALIBRATION_BATCH in flight, until they have produced CALIBRATION_MIN_TOKENS.
CALIBRATION_TOKENS, CALIBRATION_BATCH, CALIBRATION_MIN_TOKENS = 128, 4, 2048
PROBE_VERSION = 12  # bump when the probe measures differently: cached schedules are redone


def for_server(
    python: str, probe: dict, layout: str, prompts_file: str = "", measure: bool = True
) -> tuple[str, Path] | None:
    """(the `GREEDY/SAMPLED` schedule measured for a server with process `layout` (the worker gets
    every core with `all-cores`, all but one otherwise), timed on the first turns of
    `prompts_file` (suite records, as `dcoco bench-serve --prompts` reads) or the probe's own;
    the probe's record it was chosen from, for dcoco.serving.live_schedule). None where none is
    cached and `measure` is False."""
    from dcoco.decode.cost_curve import machine_fingerprint

    cores = len(os.sched_getaffinity(0))
    threads = cores if layout == "all-cores" else max(1, cores - 1)
    key = {**machine_fingerprint(), "probe": probe, "layout": layout, "threads": threads}
    if prompts_file:
        probe = {**probe, "prompts": probe_prompts(prompts_file)}
        key["prompts"] = hashlib.sha256(json.dumps(probe["prompts"]).encode()).hexdigest()[:16]
    found = measured(python, probe, key, threads, measure)
    return None if found is None else (found[0], record_path(key))


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


def measured(
    python: str, probe: dict, key: dict, threads: int, measure: bool = True
) -> tuple[str, dict] | None:
    """(`GREEDY/SAMPLED[@N]` schedules, the probe's record) for the served method `probe`
    describes (model, dtype, speculative config, max_model_len, kv_cache_bytes), cached by `key`;
    None where none is cached and `measure` is False."""
    record_key, path = {**key, "probe_version": PROBE_VERSION}, record_path(key)
    if path.is_file():
        try:
            return _chosen_again(path, json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError, DcocoError):
            pass  # a damaged record is measured again below
    if not measure:
        return None
    print("dcoco: measuring the draft schedule (once per machine and method)", file=sys.stderr)
    summary = _run_probe(python, _probe_request(probe), threads)
    schedule, rates = schedule_from(summary)
    record = {
        "schedule": schedule,
        "tokens_per_s": rates,  # b x tau(K) / step(b, K), what the schedule was chosen from
        "measured_tokens_per_s": summary["rates"],  # at the probe's own acceptance
        "step_s": summary["step_s"],  # each cell's fastest pass
        "step_s_passes": summary.get("step_s_passes"),  # every pass, to see the noise
        "logits_s": summary.get("logits_s"),  # a compute_logits call (a head's cost: head_off's)
        "acceptance": summary["acceptance"],
        "head_off": summary.get("head_off"),  # the drafter's own top-1 (head methods), by T
        "key": record_key,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return schedule, record


def record_path(key: dict) -> Path:
    """Where the probe's record for `key` (as `measured` takes it) is cached."""
    record_key = {**key, "probe_version": PROBE_VERSION}
    digest = hashlib.sha256(json.dumps(record_key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "serve-schedules" / f"{digest}.json"


def _chosen_again(path: Path, record: dict) -> tuple[str, dict]:
    """A cached record's schedule chosen again from its measurements, so that a change in how
    schedules are chosen (dcoco.serving.schedule_choice) reaches cached machines without
    re-running the probe; the record is rewritten when the choice moved."""
    schedule, rates = schedule_from(record)
    parse_pair(schedule, OPEN_END)
    if (schedule, rates) != (record["schedule"], record["tokens_per_s"]):
        record = {**record, "schedule": schedule, "tokens_per_s": rates}
        path.write_text(json.dumps(record, indent=1))
    return schedule, record


def _probe_request(probe: dict) -> dict:
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
        "passes": PROBE_PASSES,
        "calibration": {
            "max_tokens": CALIBRATION_TOKENS,
            "batch": CALIBRATION_BATCH,
            "min_tokens": CALIBRATION_MIN_TOKENS,
        },
        "head": _has_head(probe["speculative"].get("model", "")),  # also timed without it
    }


def _has_head(model: str) -> bool:
    """Whether the served drafter checkpoint holds a draft head (vLLM's ngram has no model)."""
    return bool(model) and head_kind_of(model) is not None


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
            probe = subprocess.Popen(
                [python, "-m", "dcoco.serving.vllm.schedule_probe", str(request_file)],
                env=env,
                stdout=sink,
                stderr=sink,
            )
            code = follow(probe, log)
        if code != 0 or not summary_file.is_file():
            tail = log.read_text(errors="replace")[-2000:]
            raise DcocoError(f"the draft-schedule probe failed (log {log}):\n{tail}")
        return json.loads(summary_file.read_text())
