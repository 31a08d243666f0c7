"""In-context copy hints: what prompt lookup would propose, as inputs to the drafter's mask slots.

A drafter whose config has `copy_hints` fills each mask slot of `[anchor, MASK x (B-1)]` with the
token that prompt lookup would put there, where it has one: the n-gram ending at the anchor
(longest n in MAX_NGRAM .. MIN_NGRAM) is looked up among its earlier occurrences, and the tokens
after the most recent one are the hints, continued through the hints themselves once they pass the
anchor (a loop shorter than the block keeps looping). Slots without a hint keep MASK.

The drafter then decides per slot whether to trust the hint. Its hidden state starts at the hint's
embedding, but two layers and the final norm carry it only part of the way to the tied head: a
hinted drafter still overrode right hints where its own top token had a probability under 0.1
(issue 16). A drafter with a `copy_gate` therefore adds a learnt bonus, one scalar per slot read
from the slot's final hidden state, to the hint's logit (`add_copy_bonus`): a direct copy path,
zero at initialisation. Hints read only tokens up to the anchor: the same tokens decoding has
committed, so training and decoding see the same inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.models.cpu import cpu_kernels

MAX_NGRAM = 3
MIN_NGRAM = 2  # a single-token match is right too rarely to be worth a hint
NO_HINT = -1


def match_table(ids: list[int]) -> list[int]:
    """follow[i]: the position right after the most recent earlier occurrence of the longest
    n-gram (MAX_NGRAM .. MIN_NGRAM) ending at position i, or NO_HINT when it has none. The same
    match as prompt lookup's on the context `ids[: i + 1]`."""
    last_end = _ngram_ends()
    return [_follow(ids, i, last_end) for i in range(len(ids))]


def _ngram_ends() -> list[dict[tuple[int, ...], int]]:
    """Per n, each n-gram's last end position so far (what _follow reads and updates)."""
    return [{} for _ in range(MAX_NGRAM + 1)]


def _follow(ids: list[int], i: int, last_end: list[dict[tuple[int, ...], int]]) -> int:
    """match_table(ids)[i], given the n-gram ends of ids[:i]; records the n-grams ending at i."""
    follow = NO_HINT
    for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
        if i + 1 < n:
            continue
        key = tuple(ids[i + 1 - n : i + 1])
        end = last_end[n].get(key)
        if end is not None and follow == NO_HINT:
            follow = end + 1
        last_end[n][key] = i
    return follow


def last_match(tokens: Tensor, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> int:
    """`match_table(tokens)[-1]` without the table, vectorised: the position right after the most
    recent earlier occurrence of the longest n-gram (max_ngram .. min_ngram) ending at the last
    of `tokens` [tokens], or NO_HINT. Prompt lookup's match too, with its own n range."""
    return _longest_match(tokens, max_ngram, min_ngram)[1]


def match_length(tokens: Tensor, max_ngram: int = MAX_NGRAM) -> int:
    """The n of that match with n from max_ngram down to 1, or 0 when the last token of `tokens`
    [tokens] never occurred before: how much the context repeats itself at the anchor."""
    return _longest_match(tokens, max_ngram, 1)[0]


def _longest_match(tokens: Tensor, max_ngram: int, min_ngram: int) -> tuple[int, int]:
    """(n, the position after its most recent earlier occurrence), or (0, NO_HINT)."""
    length = tokens.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = tokens[: length - 1].unfold(0, n, 1)  # [starts, n]; excludes the suffix itself
        hits = (windows == tokens[length - n :]).all(dim=1).nonzero().flatten()
        if hits.numel():
            return n, int(hits[-1]) + n  # the most recent match is the best predictor
    return 0, NO_HINT


def context_hints(tokens: Tensor, slots: int) -> Tensor:
    """[slots] hints of the block anchored at the last of the committed `tokens` [tokens]."""
    start = last_match(tokens)
    if start == NO_HINT:
        return tokens.new_full((slots,), NO_HINT)
    period = tokens.shape[0] - start  # anchor + 1 - start: the loop the hints go round
    return tokens[start + torch.arange(slots, device=tokens.device) % period]


def hints_at(ids: list[int], follow: list[int], anchor: int, slots: int) -> list[int]:
    """The `slots` hints of the block anchored at `anchor` (NO_HINT each when there is no match):
    `ids[follow[anchor]:]`, continued through the hints once they pass the anchor, so a hint
    past the anchor repeats the one a period earlier."""
    start = follow[anchor]
    if start == NO_HINT:
        return [NO_HINT] * slots
    period = anchor + 1 - start
    return [ids[start + k % period] for k in range(slots)]


class ContextMatcher:
    """context_hints(tokens, slots) for a sequence that grows between calls (a reply being
    decoded), from the n-grams of the new tokens only: match_table's lookups kept across calls,
    where context_hints compares against the whole context every cycle (86 µs at 300 tokens on
    a 2-core Zen 4, a twentieth of a draft pass). Make one per sequence; one shorter than the
    last call's, or differing at its last token, starts over as a new sequence."""

    def __init__(self):
        self._ids: list[int] = []
        self._last_end = _ngram_ends()
        self._follow = NO_HINT  # match_table(self._ids)[-1]

    def hints(self, tokens: Tensor, slots: int) -> Tensor:
        """[slots] hints of the block anchored at the last of `tokens` [tokens]."""
        seen = len(self._ids)
        if tokens.shape[0] < seen or (seen and int(tokens[seen - 1]) != self._ids[-1]):
            self._ids, self._last_end, seen = [], _ngram_ends(), 0
        for token in tokens[seen:].tolist():
            self._ids.append(token)
            self._follow = _follow(self._ids, len(self._ids) - 1, self._last_end)
        start = self._follow
        if start == NO_HINT or not self._ids:
            return tokens.new_full((slots,), NO_HINT)
        period = len(self._ids) - start
        hints = [self._ids[start + k % period] for k in range(slots)]
        return torch.tensor(hints, dtype=tokens.dtype, device=tokens.device)


def add_copy_bonus(
    logits: Tensor, bonus: Tensor, hint_columns: Tensor, fused: bool = True
) -> Tensor:
    """`logits` [..., slots, vocab'] in fp32 with `bonus` [..., slots] added at each slot's hint
    column `hint_columns` [..., slots] (a negative column: no hint, the slot is unchanged); the
    input is left as it was. `fused`: outside autograd on a CPU, one C++ call
    (cpu_kernels.copy_bonus, the same sums: ~10 against ~60 µs for 7 x 16,000 logits on a 2-core
    Zen 4); False keeps PyTorch's operators (vLLM's workers compile nothing of ours)."""
    if fused and not bonus.requires_grad and cpu_kernels.takes_rows(logits):
        rows = logits.reshape(-1, logits.shape[-1])
        flat = cpu_kernels.kernels().copy_bonus(
            rows, bonus.reshape(-1).float().contiguous(), hint_columns.reshape(-1).contiguous()
        )
        return flat.view(*logits.shape)
    out = logits.to(torch.float32, copy=True)  # one copy, added into in place
    added = (bonus * (hint_columns >= 0)).to(out.dtype)[..., None]
    return out.scatter_add_(-1, hint_columns.clamp(min=0)[..., None], added)
