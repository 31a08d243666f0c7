"""Copy hints in vLLM: prompt lookup's tokens in a copy-hint drafter's mask slots.

vLLM's DFlash proposer writes `[anchor, MASK x K]` per request into its `input_ids` buffer
(`set_inputs_first_pass`). For a drafter whose config has `dcoco.copy_hints`, `install()` wraps
that method so that the mask slots then hold the hints our engine gives the same drafter
(dcoco.models.drafter.copy_hints.context_hints), from each request's committed tokens.

DFlash drafts before vLLM's bookkeeping (it supports only the padded drafter batch), so the
runner's token table does not hold this step's accepted tokens yet. They are rebuilt from what the
proposer is given: the table up to the first position verified this step, the verified tokens
(`target_token_ids`) less the rejected ones, and the anchor. A request whose tokens cannot be read
(a placeholder, as under async scheduling) keeps its MASK slots. Hints are inputs to a proposal: a
missing one costs acceptance, never correctness, since verification does not read them.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from dcoco.models.drafter.copy_hints import NO_HINT, context_hints

_installed = False


def write_hints(
    input_ids: Tensor,  # [requests * (1 + slots) + padding]: request-major [anchor, MASK x slots]
    anchors: list[int],  # [requests] each block's anchor (the token just sampled)
    histories: list[Tensor],  # [requests] each request's committed tokens, [tokens] each
    slots: int,
    mask_token_id: int,
) -> int:
    """Fill the mask slots of `input_ids` in place with each request's hints; returns how many
    requests got them (those whose committed tokens end at their anchor)."""
    blocks = input_ids[: len(anchors) * (1 + slots)].view(len(anchors), 1 + slots)
    hinted = 0
    for row, (anchor, history) in enumerate(zip(anchors, histories, strict=True)):
        if history.numel() == 0 or int(history[-1]) != anchor:
            continue
        hints = context_hints(history.long(), slots)  # [slots]
        filled = torch.where(hints != NO_HINT, hints, mask_token_id)
        blocks[row, 1:] = filled.to(device=blocks.device, dtype=blocks.dtype)
        hinted += 1
    return hinted


def install() -> None:
    """Wrap vLLM's `DFlashProposer.set_inputs_first_pass` (once per process) so that copy-hint
    drafters get their hints; other drafters run unchanged."""
    global _installed
    if _installed:
        return
    from vllm.v1.spec_decode.dflash import DFlashProposer

    original = DFlashProposer.set_inputs_first_pass
    parameters = inspect.signature(original)
    original_init = DFlashProposer.__init__

    def __init__(self, vllm_config, device, runner=None):
        original_init(self, vllm_config, device, runner)
        self.dcoco_runner = runner  # the base proposer does not keep it: its token table
        self.dcoco_copy_hints = reads_hints(self.draft_model_config.hf_config)

    def set_inputs_first_pass(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if self.dcoco_copy_hints and self.num_speculative_tokens > 0:  # K = 0: no mask slots
            inputs = parameters.bind(self, *args, **kwargs).arguments  # by name, however passed
            rejected = inputs.get("num_rejected_tokens_gpu")
            histories = committed_tokens(
                self.dcoco_runner.input_batch.token_ids_cpu,
                inputs["target_token_ids"].cpu(),
                inputs["target_positions"].cpu(),
                inputs["cad"].query_start_loc_cpu.tolist(),
                None if rejected is None else rejected.tolist(),
                inputs["next_token_ids"].cpu(),
            )
            _write_batch(self, inputs["next_token_ids"].tolist(), histories)
        return result

    DFlashProposer.__init__ = __init__
    DFlashProposer.set_inputs_first_pass = set_inputs_first_pass
    _installed = True


def committed_tokens(
    token_table,  # [max requests, max len] numpy: the runner's token ids, before this step's
    target_token_ids: Tensor,  # [verified tokens]: this step's target inputs, request-major
    target_positions: Tensor,  # [verified tokens]
    query_starts: list[int],  # [requests + 1] each request's first row in the two above
    rejected: list[int] | None,  # [requests] the rejected drafts at the end of each segment
    anchors: Tensor,  # [requests] the token sampled after each segment
) -> list[Tensor]:
    """Each request's committed tokens, its anchor last: the table before the positions
    verified this step, the verified tokens that were accepted, the anchor."""
    histories = []
    for row in range(len(query_starts) - 1):
        start, end = query_starts[row], query_starts[row + 1]
        end -= rejected[row] if rejected else 0
        first = int(target_positions[start]) if end > start else 0
        before = torch.from_numpy(token_table[row, :first]).long()
        verified = target_token_ids[start:end].long()
        histories.append(torch.cat([before, verified, anchors[row : row + 1].long()]))
    return histories


def reads_hints(hf_config) -> bool:
    """Whether a drafter's (vLLM-parsed) config.json asks for copy hints."""
    return bool((getattr(hf_config, "dcoco", None) or {}).get("copy_hints"))


def _write_batch(proposer, anchors: list[int], histories: list[Tensor]) -> None:
    # A placeholder (negative) id means the table is not current: no hints for that request.
    readable = [h if bool((h >= 0).all()) else h[:0] for h in histories]
    slots, mask = proposer.num_speculative_tokens, proposer.parallel_drafting_token_id
    hinted = write_hints(proposer.input_ids, anchors, readable, slots, mask)
    # (blocks, blocks that read hints): how a caller checks that hints reach the drafter
    counts = getattr(proposer, "dcoco_hint_counts", (0, 0))
    proposer.dcoco_hint_counts = (counts[0] + len(anchors), counts[1] + hinted)
