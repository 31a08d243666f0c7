"""Steps with no drafts: vLLM's DFlash proposer at K = 0 keeps the drafter's context, nothing else.

With a batch-size schedule (dcoco.serving.draft_schedule) vLLM's scheduler asks for K = 0 draft
tokens once the batch is large enough that a verify costs more than it wins. vLLM 0.32's proposer
still runs the drafter's whole forward pass then (one query row per request) and throws the result
away: measured on the 2-core Xeon, 12% of a plain step's speed at 16 requests.

The same holds when every request of a step is sampled and the schedule for sampled requests gives
them none (dcoco.serving.vllm.sampled_drafts).

A DFlash drafter's queries never feed a later step: its KV cache holds the *context*, the target's
hidden states projected by `precompute_and_store_context_kv`, and the query rows' own keys are
overwritten by the context's once the target has verified those positions. So at K = 0 `install()`
runs only what the next drafting step reads: the hidden-state combination, the proposer's input
bookkeeping (positions and slots of the context) and the context K/V, and returns no drafts.
Verification does not read the drafter, so this changes the speed, never the output.

The step after it verifies no drafts, yet vLLM sends it through the rejection sampler (about 2 ms
a step at 32 requests here: it gathers and re-copies every row's logits). With no drafts in the
batch that sampler's output is its bonus sample of every row, so such a step is sampled as plain
decoding samples it: vLLM's sampler on the same logits, with the same `predict_bonus_token` flag.
Steps that ask for logprobs keep vLLM's path (its logprob bookkeeping differs).

Before the proposer, vLLM's runner prepares a drafting step even at K = 0: the next token of every
request (a Python loop over requests), the rejected-token bookkeeping and the proposer's input
layout, ~30 small ops a step. When the step verified no drafts (none were scheduled) nothing was
rejected, so the context is exactly the step's scheduled tokens: `install()` also wraps the runner's
`propose_draft_token_ids` to store the context K/V straight from the target's hidden states, at
the positions and KV slots the target used (the drafter shares the target's block table).

Storing the context costs ~0.9 ms a step at 8 requests on the 2-core Xeon (3% of a plain step, timed
once; docs/serving.md), and at high load the schedule may not draft again before a request ends. So
a K = 0 step with more requests than any schedule drafts at, plus the context margin (`dcoco serve
--k0-context-margin`, in the plugin's settings), stores nothing. A request that drafts again later
finds stale K/V at the positions it skipped: 16 requests at K = 0, then two drafting (K = 7) after
48 skipped positions and their prompts, τ 2.46 against 2.65 with the context stored
(scripts/reproduce/vllm_context_skip.py). Blocks filled during such steps can enter vLLM's prefix
cache with that stale drafter K/V, so a later request hitting them drafts worse too. Output is never
affected.

After a step scheduled with K = 0 the engine still asks the worker for its drafts, a round trip
between processes each step; there are none, and the scheduler has already cleared every
request's previous drafts, so the engine skips that call.
"""

from __future__ import annotations

import inspect

import torch

from dcoco.serving.draft_schedule import OPEN_END, largest_drafting_batch
from dcoco.serving.vllm.sampled_drafts import sampled_drafts, sampled_schedule
from dcoco.serving.vllm.settings import current

_installed = False
# Steps each shortcut took, in this process: how a caller checks that they ran.
STEPS = {
    "context_only": 0,
    "runner_context_only": 0,
    "context_skipped": 0,
    "plain_sampling": 0,
    "draft_calls_skipped": 0,
}
RUNNER_SHORTCUT = True  # False: K = 0 steps take the proposer's path (tests compare the two)


def install() -> None:
    """Wrap `DFlashProposer.propose` and `RejectionSampler.forward` (once per process) with
    their shortcuts for steps without drafts; the proposer's wrapper also tells the drafter
    whether every request of the step is sampled."""
    global _installed
    if _installed:
        return
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.spec_decode.dflash import DFlashProposer

    original = DFlashProposer.propose
    parameters = inspect.signature(original)

    def propose(self, *args, **kwargs):
        inputs = parameters.bind(self, *args, **kwargs).arguments  # by name, however passed
        # the draft head's ceiling for steps of sampled requests only (dcoco.serving.head_ceiling)
        self.model.sampled_step = inputs["sampling_metadata"].all_random
        if inputs["num_speculative_tokens"] != 0 and not _all_sampled_undrafted(inputs):
            return original(self, *args, **kwargs)
        return _context_only(self, inputs)

    DFlashProposer.propose = propose

    verify = RejectionSampler.forward

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if metadata.max_spec_len != 0 or sampling_metadata.max_num_logprobs is not None:
            return verify(self, metadata, draft_probs, logits, sampling_metadata)
        STEPS["plain_sampling"] += 1
        rows = metadata.bonus_logits_indices  # [requests]: every row of logits, in order
        bonus_logits = logits if logits.shape[0] == rows.shape[0] else logits[rows]
        return self.sampler(bonus_logits, sampling_metadata, predict_bonus_token=True)

    RejectionSampler.forward = forward
    _runner_context_only()
    _skip_empty_draft_calls()
    _installed = True


def _skip_empty_draft_calls() -> None:
    """EngineCore.post_step asks the worker for drafts only after a step that drafted."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    schedule, post_step = Scheduler.schedule, EngineCore.post_step

    def scheduled(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        self.dcoco_drafts_asked = output.num_spec_tokens_to_schedule
        return output

    def after_step(self, model_executed: bool) -> None:
        if getattr(self.scheduler, "dcoco_drafts_asked", None) == 0:
            STEPS["draft_calls_skipped"] += 1
            return
        post_step(self, model_executed)

    Scheduler.schedule = scheduled
    EngineCore.post_step = after_step


def _runner_context_only() -> None:
    """GPUModelRunner.propose_draft_token_ids stores the drafter's context and returns no drafts
    when the step neither verifies drafts nor asks for any."""
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids

    # vLLM 0.32's signature, spelled out: no per-step argument binding on this hot path
    def propose_draft_token_ids(
        self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
        sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
        slot_mappings,
    ):  # fmt: skip
        if (
            not RUNNER_SHORTCUT
            or scheduler_output.num_spec_tokens_to_schedule != 0
            or _verifies_drafts(spec_decode_metadata)
            or aux_hidden_states is None
            or not isinstance(self.drafter, DFlashProposer)
        ):
            return original(
                self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                sample_hidden_states, aux_hidden_states, spec_decode_metadata,
                common_attn_metadata, slot_mappings,
            )  # fmt: skip
        STEPS["runner_context_only"] += 1
        requests = common_attn_metadata.batch_size()
        if requests > _context_limit(self, sampling_metadata.all_random):
            STEPS["context_skipped"] += 1
            return torch.empty(requests, 0, dtype=torch.int64, device=self.device)
        tokens = scheduler_output.total_num_scheduled_tokens
        hidden = torch.cat([h[:tokens] for h in aux_hidden_states], dim=-1)
        return _store_context(
            self.drafter,
            self.drafter.model.combine_hidden_states(hidden),
            self._get_positions(tokens),
            common_attn_metadata.slot_mapping[:tokens],  # the drafter's KV-cache group
            requests,
        )

    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids


def _context_limit(runner, all_sampled: bool) -> int:
    """The largest batch whose K = 0 steps still store the drafter's context: the largest batch
    either schedule drafts at, plus the margin; for a step of sampled requests only, the largest
    the sampled schedule drafts at plus the margin, or 0 if it never drafts (their context is
    never read). Cached on the runner; fixed for its life."""
    limits = getattr(runner, "dcoco_context_limit", None)
    if limits is None:
        greedy = runner.speculative_config.num_speculative_tokens_per_batch_size
        sampled = sampled_schedule()
        margin = current().context_margin
        drafting = largest_drafting_batch(greedy) if greedy else OPEN_END  # None: K fixed
        if sampled is None:  # sampled requests follow the greedy schedule
            limits = (drafting + margin,) * 2
        else:
            sampled_drafting = largest_drafting_batch(sampled)
            sampled_limit = sampled_drafting + margin if sampled_drafting else 0
            limits = (max(drafting, sampled_drafting) + margin, sampled_limit)
        runner.dcoco_context_limit = limits
    return limits[all_sampled]


def set_runner_schedule(runner, schedule: list[list[int]]) -> None:
    """The runner's batch-size schedule replaced in place (the schedule probe between its cells,
    dcoco.serving.live_schedule when the served schedule moves); `_context_limit` is made again
    from it at the next step."""
    runner.speculative_config.num_speculative_tokens_per_batch_size = schedule
    runner.__dict__.pop("dcoco_context_limit", None)


def _verifies_drafts(metadata) -> bool:
    """vLLM builds speculative metadata every step; drafts were verified if any row had some."""
    return metadata is not None and metadata.max_spec_len != 0


def _all_sampled_undrafted(inputs: dict) -> bool:
    """Every request of the step is sampled and the sampled schedule gives them no drafts."""
    batch = inputs["common_attn_metadata"].batch_size()
    return inputs["sampling_metadata"].all_random and sampled_drafts(batch) == 0


@torch.inference_mode()
def _context_only(proposer, inputs: dict) -> torch.Tensor:
    """The drafter's context K/V for this step's verified tokens; [requests, 0] draft ids."""
    STEPS["context_only"] += 1
    proposer.num_speculative_tokens = 0  # the input layout below then expands no query rows
    cad = inputs["common_attn_metadata"]
    hidden = proposer.model.combine_hidden_states(inputs["target_hidden_states"])
    proposer.set_inputs_first_pass(
        target_token_ids=inputs["target_token_ids"],
        next_token_ids=inputs["next_token_ids"],
        target_positions=inputs["target_positions"],
        target_hidden_states=hidden,
        token_indices_to_sample=inputs.get("token_indices_to_sample"),
        cad=cad,
        num_rejected_tokens_gpu=inputs.get("num_rejected_tokens_gpu"),
    )
    num_context = proposer._dflash_num_context
    return _store_context(
        proposer,
        proposer._dflash_hidden_states,
        proposer._context_positions_buffer[:num_context],
        proposer._context_slot_mapping_buffer[:num_context],
        cad.batch_size(),
    )


@torch.inference_mode()
def _store_context(
    proposer,
    hidden: torch.Tensor,  # [tokens, hidden] the target's combined hidden states
    positions: torch.Tensor,  # [tokens]
    slots: torch.Tensor,  # [tokens] KV-cache slots
    requests: int,
) -> torch.Tensor:
    """Write the drafter's context K/V; [requests, 0] draft ids."""
    proposer.num_speculative_tokens = 0
    proposer._last_draft_probs = None
    proposer.model.precompute_and_store_context_kv(hidden, positions, slots)
    return torch.empty(requests, 0, dtype=torch.int64, device=hidden.device)
