"""The decode engine: prefill -> (propose -> verify -> commit)* for one request.

Plain decoding is this same loop with no proposer (every cycle verifies just the anchor), so a
speedup measured against it compares like with like.

Cache invariant: before each cycle the target cache holds every committed token except the anchor
(the last committed token). Verification appends the anchor and the drafts; commit crops the cache
back to anchor + accepted drafts, so rejected K/V are forgotten by length alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dcoco.contracts import Proposal, SamplingParams, Verdict
from dcoco.decode.draft_length import ContextMode, DraftLengthPolicy
from dcoco.decode.proposers import DraftContext, Proposer, empty_proposal
from dcoco.decode.sampling import sample_from_logits
from dcoco.decode.stats import RequestStats
from dcoco.decode.verify import verify
from dcoco.errors import DcocoError
from dcoco.models.drafter.copy_hints import match_length
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.target import TargetModel


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    new_ids: list[int]
    finish_reason: str  # "stop" (a stop id was emitted) or "length"
    stats: RequestStats = field(default_factory=RequestStats)


class Engine:
    def __init__(
        self,
        target: TargetModel,
        proposer: Proposer | None = None,
        draft_length: DraftLengthPolicy | None = None,
    ):
        """`draft_length`: picks each cycle's number of drafts (`--num-draft-tokens auto`); None
        lets the proposer draft as many as it is set to."""
        self.target = target
        self.proposer = proposer
        self.draft_length = draft_length if proposer else None

    @property
    def method(self) -> str:
        return self.proposer.name if self.proposer else "plain"

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int = 256,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> GenerationResult:
        sampling = sampling or SamplingParams()
        budget = self._check_request(prompt_ids, max_new_tokens)
        target, proposer, device = self.target, self.proposer, self.target.device
        taps = proposer.feature_layers if proposer else ()
        generator = torch.Generator(device=device).manual_seed(seed)
        stats = RequestStats(prompt_tokens=len(prompt_ids))
        tokens = torch.tensor(prompt_ids, dtype=torch.long, device=device)  # [tokens]
        new_ids: list[int] = []
        started = time.perf_counter()

        # 1. prefill: the whole prompt; its last logits give the first token (the first anchor).
        cache = target.new_cache()
        out = target.forward(tokens[None], cache, feature_layers=taps, last_logits_only=True)
        first = sample_from_logits(out.logits[:, -1], sampling, generator)  # [batch]
        new_features = out.features
        if proposer:
            proposer.start(prompt_ids)
        finish = self._commit_tokens([int(first)], new_ids, budget, on_tokens)
        tokens = torch.cat([tokens, first])
        stats.prefill_s = _elapsed(started, device)

        while finish is None:
            cycle_started = time.perf_counter()  # auto forecasts whole cycles (cycle_meter)
            # 2. propose: at most as many drafts as the budget and the context can still take.
            max_slots = min(budget - len(new_ids) - 1, target.max_context - tokens.shape[0])
            mode = self._context_mode(tokens, sampling)
            if self.draft_length and proposer is not None and max_slots > 0:  # auto; 0: plain step
                max_slots = min(max_slots, self.draft_length.next_length(mode))
            tick = time.perf_counter()
            draft_context = DraftContext(tokens, new_features, max_slots, sampling, generator)
            proposal = self._propose(draft_context)
            propose_s = _elapsed(tick, device) - proposal.setup_s
            stats.setup_s += proposal.setup_s
            stats.draft_s += propose_s - proposal.correct_s
            stats.correct_s += proposal.correct_s
            # taps the proposer did not read this cycle must reach it next cycle
            skipped_features = new_features if proposer is None or max_slots <= 0 else None

            # 3. verify: one target forward over [anchor, drafts...].
            tick = time.perf_counter()
            block = torch.cat([tokens[-1:], proposal.draft_tokens[0]])[None]  # [batch, 1 + slots]
            out = target.forward(block, cache, feature_layers=taps)
            verdict: Verdict = verify(proposal, out.logits, sampling, generator)
            verify_s = _elapsed(tick, device)
            stats.verify_s += verify_s

            # 4. commit: the accepted drafts and the corrected/bonus token.
            accepted = int(verdict.num_accepted[0])
            crop_cache(cache, tokens.shape[0] + accepted)
            committed = torch.cat([proposal.draft_tokens[0, :accepted], verdict.next_token])
            finish = self._commit_tokens(committed.tolist(), new_ids, budget, on_tokens)
            tokens = torch.cat([tokens, committed])
            new_features = _pending_features(skipped_features, out.features, accepted)
            cycle_s = _elapsed(cycle_started, device) - proposal.setup_s
            timed = (propose_s, verify_s, cycle_s)
            self._record_cycle(stats, proposal.num_slots, accepted, timed, mode)

        stats.new_tokens = len(new_ids)
        stats.total_s = _elapsed(started, device) - stats.setup_s
        return GenerationResult(list(prompt_ids), new_ids, finish, stats)

    def _context_mode(self, tokens, sampling: SamplingParams) -> ContextMode:
        """The key the draft-length policy keeps its rates under (dcoco.decode.draft_length)."""
        if not self.draft_length:
            return ContextMode()
        return ContextMode(match_length(tokens), None if sampling.greedy else sampling)

    def _propose(self, context: DraftContext) -> Proposal:
        max_slots = context.max_slots
        if self.proposer is None or max_slots <= 0:
            return empty_proposal(context.tokens.device)
        proposal = self.proposer.propose(context)
        if proposal.num_slots > max_slots:
            proposal = Proposal(
                draft_tokens=proposal.draft_tokens[:, :max_slots],
                draft_probs=None
                if proposal.draft_probs is None
                else proposal.draft_probs[:, :max_slots],
                correct_s=proposal.correct_s,
                setup_s=proposal.setup_s,
            )
        return proposal

    def _record_cycle(self, stats, proposed: int, accepted: int, timed, mode) -> None:
        """`timed`: the seconds of the proposer's pass, the verify forward, the whole cycle."""
        stats.record_cycle(proposed, accepted)
        if self.draft_length:
            propose_s, verify_s, cycle_s = timed
            self.draft_length.observe(proposed, accepted, propose_s, mode, verify_s, cycle_s)

    def _commit_tokens(self, ids, new_ids, budget, on_tokens) -> str | None:
        """Append `ids` to the output, stopping at a stop id or the budget; returns why it ended."""
        finish = None
        for position, token in enumerate(ids):
            if token in self.target.stop_ids:
                ids, finish = ids[: position + 1], "stop"
                break
        room = budget - len(new_ids)
        if len(ids) >= room:
            ids, finish = ids[:room], finish or "length"
        new_ids.extend(ids)
        if on_tokens and ids:
            on_tokens(ids)
        return finish

    def _check_request(self, prompt_ids: list[int], max_new_tokens: int) -> int:
        """The number of new tokens this request may emit."""
        if max_new_tokens <= 0:
            raise DcocoError(f"max-new-tokens must be > 0, got {max_new_tokens}")
        if not prompt_ids:
            raise DcocoError("the prompt is empty")
        context = self.target.max_context
        if len(prompt_ids) >= context:
            raise DcocoError(
                f"the prompt has {len(prompt_ids)} tokens but the target's context is {context}"
            )
        vocab = self.target.info.vocab_size
        if max(prompt_ids) >= vocab or min(prompt_ids) < 0:
            raise DcocoError(f"prompt token ids must lie in [0, {vocab})")
        return min(max_new_tokens, context - len(prompt_ids))


def _pending_features(unseen, verified, accepted: int):
    """Taps of the committed tokens the proposer has not read: those of the anchor and the
    accepted drafts, after any it never read because the cycle drafted nothing."""
    if verified is None:
        return None
    kept = verified[:, : accepted + 1]  # [batch, accepted + 1, taps * hidden]
    return kept if unseen is None else torch.cat([unseen, kept], dim=1)


def _elapsed(start: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
