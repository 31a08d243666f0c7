"""The head proposer: the DFlash drafter's one pass, then a draft head (dcoco.models.heads.base)
turns it into the draft: the DCOCO corrector with the selection rule this proposer passes on every
call, or a sequential DSpark/Domino-style head. Every head's draft is deterministic, so the engine
verifies it as a point mass (lossless); with `sampled_drafts`, a sampled request gets the drafter's
sampled drafts instead (a draw from q is accepted more often than any one pick at T = 1:
dcoco.decode.sampled_drafts)."""

from __future__ import annotations

import time

import torch
from torch import nn

from dcoco.contracts import Proposal
from dcoco.decode.correction_gate import CorrectionGate
from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.proposers import DraftContext
from dcoco.errors import DcocoError
from dcoco.models.cpu.row_reduce import row_argmax
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.heads.head_compile import HeadSelect
from dcoco.models.heads.selection import check_selection


class HeadProposer(DFlashProposer):
    def __init__(
        self,
        drafter: BlockDrafter,
        head: nn.Module,
        num_draft_tokens: int | None = None,
        name: str | None = None,
        selection: str | None = None,
        acceptance_prior: tuple[float, ...] = (),
        compile_head: bool = False,
        sampled_drafts: bool = False,
        fused_walk: bool = True,
        correction_gate: bool = False,
    ):
        """`selection`: the corrector's rule (dcoco.models.heads.selection); None = its default.
        `acceptance_prior`: as for DFlashProposer. `compile_head`: a DCOCO corrector's pick
        compiled (dcoco.models.heads.head_compile) on the first draft, where `fused_walk` does
        not run its walk as one C++ call (dcoco.models.heads.fused_walk: on a CPU where the
        kernels build). `correction_gate`: a DCOCO corrector corrects a greedy cycle only at
        draft lengths where its measured gain pays for its cost (dcoco.decode.correction_gate)."""
        super().__init__(drafter, num_draft_tokens, acceptance_prior, sampled_drafts)
        head_hidden = getattr(head.config, "hidden_size", drafter.config.hidden_size)
        if head_hidden != drafter.config.hidden_size:
            raise DcocoError(
                f"{head.kind} head hidden size {head_hidden} does not match the drafter's "
                f"{drafter.config.hidden_size}"
            )
        # 0: a head that indexes no vocabulary of its own (a corrector without pair counts)
        head_vocab = getattr(head.config, "vocab_size", 0) or drafter.config.vocab_size
        if head_vocab != drafter.config.vocab_size:
            raise DcocoError(
                f"{head.kind} head vocab size {head_vocab} does not match the drafter's "
                f"{drafter.config.vocab_size}"
            )
        top_k = getattr(head.config, "top_k", 1)
        if top_k > drafter.config.vocab_size:
            raise DcocoError(
                f"{head.kind} head top-k {top_k} exceeds the vocab size {drafter.config.vocab_size}"
            )
        if drafter.draft_vocab is not None and top_k > drafter.draft_vocab.size:
            raise DcocoError(
                f"{head.kind} head top-k {top_k} exceeds the draft vocabulary of "
                f"{drafter.draft_vocab.size} tokens: pass a larger --draft-vocab"
            )
        self.head = head
        prepare = getattr(head, "prepare_inference", None)  # tables built before any timed draft
        if prepare is not None:
            prepare()
        if selection and head.kind != "dcoco":
            raise DcocoError(f"a {head.kind} head takes no selection rule (only dcoco does)")
        self.selection = check_selection(selection) if selection else None
        self.name = name or head.kind
        vocab = drafter.draft_vocab
        columns = None if vocab is None else vocab.token_ids
        # the corrector's pick is some 300 small operators eagerly: on a CPU its walk runs as one
        # C++ call where the kernels build, else compiled; the sequential heads are a few per
        # slot, and not compiled here
        compile_head = compile_head and head.kind == "dcoco"
        self.gate = CorrectionGate() if correction_gate and head.kind == "dcoco" else None
        self.select = HeadSelect(
            head, self.selection, columns, self.num_draft_tokens, compile=compile_head,
            batch_sizes=(1,), fused=fused_walk,
        )  # fmt: skip

    def start(self, prompt_ids: list[int]) -> None:
        super().start(prompt_ids)
        if self.gate is not None:
            self.gate.start()

    @torch.inference_mode()
    def propose(self, context: DraftContext) -> Proposal:
        started = time.perf_counter()
        # Cut to this cycle's slots first, so path rules weigh only the slots proposed.
        logits, hidden = self.draft_block(context)  # [batch, slots, vocab], [batch, slots, hidden]
        if self.sampled_drafts and context.sampled:
            return self.sampled_proposal(logits, context)
        gate = self.gate if not context.sampled else None
        if gate is not None:
            gate.observe(context.tokens)
            if not gate.should_correct(logits.shape[1]):
                return Proposal(draft_tokens=self.drafter.token_ids(row_argmax(logits)))
        tick = time.perf_counter()
        anchor_ids = context.tokens[-1:].expand(logits.shape[0])  # [batch]
        setup_before = self.select.setup_s
        draft_tokens = self.select(hidden, logits, anchor_ids)
        if draft_tokens.is_cuda:
            torch.cuda.synchronize(draft_tokens.device)
        setup_s = self.select.setup_s - setup_before  # compiled in this call: not a cost
        if gate is not None:  # what the argmax would have drafted, to score this cycle by
            argmax = self.drafter.token_ids(row_argmax(logits))[0].tolist()
        correct_s = time.perf_counter() - tick - setup_s
        if gate is not None:
            position = context.tokens.shape[0]
            gate.drafted(position, draft_tokens[0].tolist(), argmax, correct_s, started)
        return Proposal(draft_tokens=draft_tokens, correct_s=correct_s, setup_s=setup_s)
