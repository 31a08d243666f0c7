"""Load-aware draft heads: up to how many running requests a served draft head picks the drafts.

A draft head (DCOCO's corrector, a DSpark- or Domino-style sequential head) re-selects each slot
of the drafter's block, at a cost that grows with the batch: in vLLM-CPU, `dcoco` at 2 drafts and
16 requests spent 9 of a 91 ms step in the corrector, so its measured schedule stopped drafting at
9 requests where `dflash`, the same drafter's own top-1, still paid at 16. Above the head's
ceiling N the plugin drafts the drafter's own top-1 (copy gate included) and skips the head, so a
head method is never slower than its drafter alone; either way the drafts are verified, so the
output does not change.

Sampled requests accept far fewer drafts, so the head wins less there while costing the same: in
vLLM-CPU, `dcoco` at T = 1, one request, 2 drafts (scripts/reproduce/vllm_draft_cost.py), 34.6
and 34.8 tokens/s with the head against 35.5 without. A step whose requests are all sampled has a
ceiling M of its own; a step holding a greedy request keeps N.

`dcoco serve --draft-schedule auto` measures N and M with the schedule
(dcoco.serving.auto_schedule, vllm_schedule_probe: the probe also times every cell with the head
switched off and calibrates the drafter's own acceptance at each temperature; schedule_choice) and
writes them after the schedule, `GREEDY/SAMPLED@N/M` (`@N` when M = N); no `@`: the head picks at
every batch size. The plugin's settings (dcoco.serving.vllm.settings) carry N and M to it.
"""

from __future__ import annotations

from dcoco.serving.draft_schedule import OPEN_END  # here: no ceiling
from dcoco.serving.vllm.settings import current

Rates = dict[int, dict[int, float]]  # {batch size: {K: tokens/s}}


def head_max_batch(sampled_step: bool = False) -> int:
    """N from the plugin's settings, or M for a step whose requests are all sampled; read at
    every drafting step: the schedule probe changes them between its timed cells in its own
    process, and the lookup costs nothing next to a step."""
    settings = current()
    return settings.sampled_head_max_batch if sampled_step else settings.head_max_batch


def choose_ceiling(with_head: Rates, without_head: Rates) -> int:
    """The largest measured batch size below the first one at which the drafter's own top-1 is
    predicted faster than the head's pick (their best K each; K = 0 is the same cell for both);
    OPEN_END when the head is never slower, 0 when it is slower from one request on."""
    ceiling = 0
    for batch in sorted(with_head):
        if max(without_head.get(batch, {}).values(), default=0.0) > max(with_head[batch].values()):
            return ceiling
        ceiling = batch
    return OPEN_END


def merged_rates(with_head: Rates, without_head: Rates, ceiling: int) -> Rates:
    """The rates the schedule is chosen from: with the head up to `ceiling`, without beyond."""
    return {
        batch: by_k if batch <= ceiling else {0: by_k[0], **without_head[batch]}
        for batch, by_k in with_head.items()
    }


def head_steps(summary: dict, temperature: str) -> dict[str, dict[str, float]]:
    """The probe's step times with the head, {K: {batch: seconds}}, at `temperature`: where the
    probe timed the drafter model's `compute_logits` with and without the head (version 10), a
    drafting cell is its head-off twin plus the head's extra per call (never less than the twin);
    the head's own timed cell otherwise: the head adds a few ms to steps of 30-300 ms, so the
    difference of two timed steps is mostly the machine's noise, that of two timed calls is not."""
    steps, off = summary["step_s"][temperature], summary.get("head_off") or {}
    with_head = (summary.get("logits_s") or {}).get(temperature, {})
    without = (off.get("logits_s") or {}).get(temperature, {})
    twins = (off.get("step_s") or {}).get(temperature, {})
    out = {}
    for k, by_batch in steps.items():
        on, bare, twin = with_head.get(k, {}), without.get(k, {}), twins.get(k, {})
        out[k] = {
            b: round(twin[b] + max(0.0, on[b] - bare[b]), 6) if b in on and b in bare else s
            for b, s in by_batch.items()
        }
    return out
