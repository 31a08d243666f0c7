"""`dcoco bench-serve --servers LABEL=URL,...`: which servers, and in what order they take each
level (the loop is dcoco.eval.served.bench's), so that their ratios come from the same minutes.

On a shared 2-core VM the machine's own speed drifts by 10-30% over the tens of minutes a sweep
of one server after another takes (2026-12-04, Intel Xeon: the same `dcoco` server and schedule
served 62.2 tokens/s at one stream, then 44.4 forty minutes later), more than the margins the
sweep is read for. Here every server is up at once (started one after another, so that each
one's schedule probe had the machine alone) and, at each temperature and concurrency, each
server runs the level in turn; the order reverses from one level to the next, so no server always
goes first. An idle vLLM-CPU server only waits on its queue. Each server's result has the layout
of a one-server run (`<out>/<label>/bench_serve.json`), so `--compare` reads it as before.

With `--turns N` each level is split into N turns of equal shares of its requests, every server
taking each turn and the order reversing from turn to turn (A B B A within a level for an even
N), so a machine whose speed swings over tens of seconds hits every server alike. On the
model-207 Xeon (2026-12-05, four servers, one turn a level) plain served 65.3 tokens/s at 4
greedy streams and 114.1 at 4 sampled ones in one run, a level of four servers lasting 2-5 min.
"""

from __future__ import annotations

from dcoco.errors import DcocoError


def parse_servers(specs: tuple[str, ...]) -> list[tuple[str, str]]:
    """`LABEL=URL` items -> [(label, base url)], labels unique."""
    servers = []
    for spec in specs:
        label, sep, url = spec.partition("=")
        if not sep or not label.strip() or not url.strip():
            raise DcocoError(f"--servers takes LABEL=URL items, got '{spec}'")
        servers.append((label.strip(), url.strip().rstrip("/")))
    labels = [label for label, _ in servers]
    if len(set(labels)) != len(labels):
        raise DcocoError(f"--servers labels must differ: {', '.join(labels)}")
    return servers


def turn_order(servers: list, turn_index: int) -> list:
    """The servers in the order they take turn `turn_index` (counted over every level and
    temperature): as given, then reversed, so that no server always goes first."""
    return list(servers) if turn_index % 2 == 0 else list(servers)[::-1]


def level_turns(texts: list[str], concurrency: int, rounds: int, turns: int) -> list[list[str]]:
    """A level's requests, max(prompts, rounds x concurrency) of them (prompts cycled), in `turns`
    consecutive turns as equal as they split."""
    count = max(len(texts), rounds * concurrency)
    requests = [texts[i % len(texts)] for i in range(count)]
    bounds = [count * n // turns for n in range(turns + 1)]
    return [requests[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]
