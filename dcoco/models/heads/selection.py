"""Selection rules: pick one candidate per slot from a corrector's Scores.

Each rule maps Scores to candidate indices [batch, slots] (index 0 is the drafter's top-1 at that
slot); `selected_token_ids` turns indices into the draft's token ids. A path k_0 .. k_{slots-1}
scores L[0, k_0] (or start[k_0]) + sum_p S[p, k_p, k_{p+1}].

The rule is a decoding choice, not a weight: callers pass its name to `Corrector.select` on every
call (`METHOD:SELECTION` in dcoco.decode.methods; the drafter config's `dcoco_selection` in vLLM).
So is the number of candidates it walks: `RULE/K` keeps only the drafter's top K of the
corrector's trained top-k per slot (`greedy/4`), a K^2 / k^2 share of the transition grid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dcoco.errors import DcocoError

DEFAULT_GAMMA = 0.8
DEFAULT_SELECTION = "greedy"


@dataclass
class Scores:
    """The corrector's view of one drafted block."""

    candidate_ids: Tensor  # [batch, slots, K] int64, by drafter logit, descending
    candidate_logits: Tensor  # [batch, slots, K] fp32: L, the drafter's logits of the candidates
    transitions: Tensor  # [batch, slots - 1, K, K] fp32: S[p, a, b]
    # [batch, K] fp32: slot 0's scores from the anchor (a corrector that re-selects slot 0);
    # None = slot 0 keeps the drafter's top-1 (the walk) or scores L[0] (the path rules)
    start: Tensor | None = None


def selected_token_ids(scores: Scores, indices: Tensor) -> Tensor:
    """Candidate indices [batch, slots] -> token ids [batch, slots]."""
    return scores.candidate_ids.gather(-1, indices[..., None]).squeeze(-1)


def top1(scores: Scores) -> Tensor:
    """The uncorrected drafter: its own argmax (index 0) at every slot."""
    return torch.zeros_like(scores.candidate_ids[..., 0])


def greedy(scores: Scores) -> Tensor:
    """Prefix-first walk: slot 0 keeps the drafter's top-1 (or takes argmax start), then
    k[p+1] = argmax_b S[p, k[p], b].

    Each choice is conditioned only on the already chosen prefix, the order the target verifies
    in, so a corrected slot never trades away an earlier one."""
    transitions = scores.transitions  # [batch, slots - 1, K, K]
    rows = torch.arange(transitions.shape[0], device=transitions.device)
    if scores.start is None:
        index = torch.zeros_like(scores.candidate_ids[:, 0, 0])  # [batch]
    else:
        index = scores.start.argmax(dim=-1)
    path = [index]
    for p in range(transitions.shape[1]):
        index = transitions[rows, p, index].argmax(dim=-1)  # row S[p, k[p], :] is [batch, K]
        path.append(index)
    return torch.stack(path, dim=1)


def keep_first(scores: Scores) -> Tensor:
    """The paper's rule: the prefix-first walk from the drafter's own top-1 at slot 0, whatever
    start scores a corrector trained with anchor scores has (its share of the gain at slot 0
    measured apart)."""
    return greedy(dataclasses.replace(scores, start=None))


def best_path(scores: Scores) -> Tensor:
    """The max-sum path over all slots (Viterbi)."""
    return _viterbi(scores, [1.0] * scores.candidate_ids.shape[1])


def discounted_path(scores: Scores, gamma: float = DEFAULT_GAMMA) -> Tensor:
    """The path maximising L[0, k_0] + sum_p gamma^(p+1) S[p, k_p, k_{p+1}].

    A later slot only counts if every earlier one is accepted, so its score weighs less."""
    return _viterbi(scores, [gamma**p for p in range(scores.candidate_ids.shape[1])])


def _viterbi(scores: Scores, weights: list[float]) -> Tensor:
    """The path maximising weights[0] L[0, k_0] + sum_p weights[p+1] S[p, k_p, k_{p+1}]."""
    transitions = scores.transitions  # [batch, slots - 1, K, K]
    first = scores.candidate_logits[:, 0] if scores.start is None else scores.start
    best = weights[0] * first  # [batch, K]: best path ending at each
    came_from = []
    for p in range(transitions.shape[1]):
        # [batch, K (at p), K (at p + 1)]: each path to a at p, extended by a -> b
        extended = best[:, :, None] + weights[p + 1] * transitions[:, p]
        best, previous = extended.max(dim=1)  # [batch, K]
        came_from.append(previous)
    index = best.argmax(dim=-1)  # [batch]
    path = [index]
    for previous in reversed(came_from):
        index = previous.gather(1, index[:, None]).squeeze(1)
        path.append(index)
    return torch.stack(path[::-1], dim=1)


SELECTION_RULES: dict[str, Callable[[Scores], Tensor]] = {
    "top1": top1,
    "greedy": greedy,
    "keep1": keep_first,
    "global": best_path,
    "discounted": discounted_path,
}
# The rules that read one row of S per slot pair (the prefix-first walk), so a caller outside
# autograd may compute just those rows (dcoco.models.heads.grid_parts): name -> whether slot 0 is
# taken by the start scores (where the corrector has them) rather than kept.
WALKS = {"greedy": True, "keep1": False}


def split_selection(selection: str) -> tuple[str, int | None]:
    """`RULE` or `RULE/K` -> (rule, K or None). K: re-select among the drafter's top K only, not
    the corrector's trained top-k (fewer K x K transitions to score; K <= the trained one)."""
    rule, slash, count = selection.partition("/")
    if rule not in SELECTION_RULES:
        raise DcocoError(
            f"unknown selection '{selection}': choose one of {', '.join(SELECTION_RULES)}, "
            "optionally /K (greedy/4)"
        )
    if not slash:
        return rule, None
    if not count.isdigit() or int(count) < 1:
        raise DcocoError(f"selection '{selection}': K in RULE/K must be a whole number >= 1")
    return rule, int(count)


def check_selection(selection: str) -> str:
    split_selection(selection)
    return selection
