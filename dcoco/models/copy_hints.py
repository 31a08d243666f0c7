"""In-context copy hints: what prompt lookup would propose, as inputs to the drafter's mask slots.

A drafter whose config has `copy_hints` fills each mask slot of `[anchor, MASK x (B-1)]` with the
token that prompt lookup would put there, where it has one: the n-gram ending at the anchor
(longest n in MAX_NGRAM .. MIN_NGRAM) is looked up among its earlier occurrences, and the tokens
after the most recent one are the hints, continued through the hints themselves once they pass the
anchor (a loop shorter than the block keeps looping). Slots without a hint keep MASK.

The drafter then decides per slot whether to trust the hint. Its hidden state starts at the hint's
embedding, which the tied head already maps to the hint itself, so copying is learnt at once and
training spends itself on when not to copy. Hints read only tokens up to the anchor: the same
tokens decoding has committed, so training and decoding see the same inputs.
"""

from __future__ import annotations

MAX_NGRAM = 3
MIN_NGRAM = 2  # a single-token match is right too rarely to be worth a hint
NO_HINT = -1


def match_table(ids: list[int]) -> list[int]:
    """follow[i]: the position right after the most recent earlier occurrence of the longest
    n-gram (MAX_NGRAM .. MIN_NGRAM) ending at position i, or NO_HINT when it has none. The same
    match as prompt lookup's on the context `ids[: i + 1]`."""
    last_end: list[dict[tuple[int, ...], int]] = [{} for _ in range(MAX_NGRAM + 1)]
    follow = [NO_HINT] * len(ids)
    for i in range(len(ids)):
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if i + 1 < n:
                continue
            key = tuple(ids[i + 1 - n : i + 1])
            end = last_end[n].get(key)
            if end is not None and follow[i] == NO_HINT:
                follow[i] = end + 1
            last_end[n][key] = i
    return follow


def follow_of_last(ids: list[int]) -> int:
    """`match_table(ids)[-1]` without the table: what decoding needs once per cycle."""
    for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
        if len(ids) <= n:
            continue
        suffix = ids[-n:]
        for end in range(len(ids) - 2, n - 2, -1):  # the most recent earlier occurrence first
            if ids[end] == suffix[-1] and ids[end + 1 - n : end + 1] == suffix:
                return end + 1
    return NO_HINT


def context_hints(ids: list[int], slots: int) -> list[int]:
    """The hints of the block anchored at the last of the committed tokens `ids`."""
    follow = [NO_HINT] * (len(ids) - 1) + [follow_of_last(ids)]
    return hints_at(ids, follow, len(ids) - 1, slots)


def hints_at(ids: list[int], follow: list[int], anchor: int, slots: int) -> list[int]:
    """The `slots` hints of the block anchored at `anchor` (NO_HINT each when there is no match):
    `ids[follow[anchor]:]`, continued through the hints once they pass the anchor."""
    start = follow[anchor]
    if start == NO_HINT:
        return [NO_HINT] * slots
    hints: list[int] = []
    for k in range(slots):
        position = start + k  # <= anchor + k: a context token or an earlier hint
        hints.append(ids[position] if position <= anchor else hints[position - anchor - 1])
    return hints
