"""`dcoco bench-serve --servers LABEL=URL,...`: which servers, and in what order they take each
level (the loop is dcoco.eval.serving_bench's), so that their ratios come from the same minutes.

On a shared 2-core VM the machine's own speed drifts by 10-30% over the tens of minutes a sweep
of one server after another takes (2026-12-04, Intel Xeon: the same `dcoco` server and schedule
served 62.2 tokens/s at one stream, then 44.4 forty minutes later), more than the margins the
sweep is read for. Here every server is up at once (started one after another, so that each
one's schedule probe had the machine alone) and, at each temperature and concurrency, each
server runs the level in turn; the order reverses from one level to the next, so no server always
goes first. An idle vLLM-CPU server only waits on its queue. Each server's result has the layout
of a one-server run (`<out>/<label>/bench_serve.json`), so `--compare` reads it as before.
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


def turn_order(servers: list, level_index: int) -> list:
    """The servers in the order they take level `level_index` (counted over every temperature):
    as given, then reversed, so that no server always goes first."""
    return list(servers) if level_index % 2 == 0 else list(servers)[::-1]
