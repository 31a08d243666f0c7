"""Tables and the figure of `dcoco bench-serve` results (one run, or several compared)."""

from __future__ import annotations

from pathlib import Path


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def level_line(label: str, level: dict) -> str:
    spec = level.get("spec") or {}
    latency = level["latency_s"]
    return (
        f"[{label}] T={level['temperature']:g} c={level['concurrency']}: "
        f"{level['output_tok_s']:.1f} tok/s, p50 {_fmt(latency['p50'])}s "
        f"p90 {_fmt(latency['p90'])}s p99 {_fmt(latency['p99'])}s, tau {_fmt(spec.get('tau'))}, "
        f"errors {level['errors']}"
    )


def console_table(result: dict) -> str:
    lines = [
        f"{result['label']} ({result['num_prompts']} prompts, {', '.join(result['suites'])})",
        "| T | concurrency | tok/s | req/s | p50 s | p90 s | p99 s | τ | errors |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for level in result["levels"]:
        spec = level.get("spec") or {}
        latency = level["latency_s"]
        lines.append(
            f"| {level['temperature']:g} | {level['concurrency']} | {level['output_tok_s']:.1f} | "
            f"{level['requests_per_s']:.2f} | {_fmt(latency['p50'])} | {_fmt(latency['p90'])} | "
            f"{_fmt(latency['p99'])} | {_fmt(spec.get('tau'))} | {level['errors']} |"
        )
    return "\n".join(lines)


def plot_throughput(results: list[dict], path: Path) -> Path | None:
    """Output tok/s vs concurrency, one line per (label, temperature); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for result in results:
        for temperature in sorted({level["temperature"] for level in result["levels"]}):
            levels = [lv for lv in result["levels"] if lv["temperature"] == temperature]
            levels.sort(key=lambda lv: lv["concurrency"])
            xs = [lv["concurrency"] for lv in levels]
            ys = [lv["output_tok_s"] for lv in levels]
            ax.plot(xs, ys, marker="o", label=f"{result['label']} T={temperature:g}")
    ax.set_xscale("log", base=2)
    ticks = sorted({lv["concurrency"] for result in results for lv in result["levels"]})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_ylim(bottom=0)
    ax.set_title("throughput vs concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def compare_table(results: list[dict]) -> str:
    """Markdown: output tok/s per concurrency level for each (label, temperature), with τ."""
    levels = sorted({lv["concurrency"] for result in results for lv in result["levels"]})
    head = " | ".join(f"c={c} tok/s" for c in levels)
    lines = [
        f"| method | T | {head} | τ (per level) |",
        "|---|--:|" + "--:|" * len(levels) + "---|",
    ]
    for result in results:
        for temperature in sorted({lv["temperature"] for lv in result["levels"]}):
            by_level = {
                lv["concurrency"]: lv for lv in result["levels"] if lv["temperature"] == temperature
            }
            cells = [_fmt(by_level[c]["output_tok_s"], 1) if c in by_level else "-" for c in levels]
            taus = [
                _fmt((by_level[c].get("spec") or {}).get("tau")) for c in levels if c in by_level
            ]
            lines.append(
                f"| {result['label']} | {temperature:g} | {' | '.join(cells)} | {' '.join(taus)} |"
            )
    return "\n".join(lines)


def _row(label: str) -> str:
    """`dcoco:greedy/4@dcoco-joint-12k` -> `dcoco:greedy/4`: a label's method and selection rule,
    its checkpoint left off (two rules of one method are two rows); a server's own flags stay
    (`dflash@dflash+draft-vocab:full` -> `dflash+draft-vocab:full`, a row of its own)."""
    method, _, checkpoint = label.partition("@")
    _, plus, flags = checkpoint.partition("+")
    return method + plus + flags


def _method(row: str) -> str:
    """`dcoco:greedy/4` -> `dcoco`, `dcoco+draft-vocab:full` -> `dcoco`."""
    return row.split(":")[0].split("+")[0]


def _rates(results: list[dict]) -> dict[tuple[str, float], dict[int, float]]:
    """(row, temperature) -> {concurrency: output tok/s}."""
    rates: dict[tuple[str, float], dict[int, float]] = {}
    for result in results:
        for level in result["levels"]:
            key = (_row(result["label"]), level["temperature"])
            rates.setdefault(key, {})[level["concurrency"]] = level["output_tok_s"]
    return rates


def ratio_table(results: list[dict], baseline: str = "plain") -> str:
    """Markdown: each method's output tok/s over `baseline`'s at the same T and level."""
    rates = _rates(results)
    levels = sorted({c for by_level in rates.values() for c in by_level})
    lines = [
        f"| method | T | {' | '.join(f'c={c}' for c in levels)} |",
        "|---|--:|" + "--:|" * len(levels),
    ]
    for (method, temperature), by_level in rates.items():
        base = rates.get((baseline, temperature), {})
        cells = [
            f"{by_level[c] / base[c]:.2f}×" if c in by_level and base.get(c) else "-"
            for c in levels
        ]
        lines.append(f"| {method} | {temperature:g} | {' | '.join(cells)} |")
    return "\n".join(lines)


def margin_table(
    results: list[dict], method: str = "dcoco", heads: tuple[str, ...] = ("dspark", "domino")
) -> str:
    """Markdown: the tok/s of `method` (each of its rules a row of its own) over dflash's and
    over the best sequential head's, per level (the paper's figure as numbers)."""
    rates = _rates(results)
    ours_rows = [(row, t) for row, t in rates if _method(row) == method]
    levels = sorted({c for key in ours_rows for c in rates[key]})
    lines = [
        f"| {method} over | T | {' | '.join(f'c={c}' for c in levels)} |",
        "|---|--:|" + "--:|" * len(levels),
    ]
    for row, temperature in sorted(ours_rows, key=lambda key: (key[1], key[0] != method, key[0])):
        ours = rates[(row, temperature)]
        best_head = {
            c: max((rates.get((h, temperature), {}).get(c, 0.0) for h in heads), default=0.0)
            for c in levels
        }
        for name, other in (("dflash", rates.get(("dflash", temperature), {})),
                            ("best sequential head", best_head)):  # fmt: skip
            cells = [f"{ours[c] / other[c]:.2f}×" if other.get(c) else "-" for c in levels]
            shown = name if row == method else f"{name} (`{row}`)"
            lines.append(f"| {shown} | {temperature:g} | {' | '.join(cells)} |")
    return "\n".join(lines)


def numbered(results: list[dict]) -> list[dict]:
    """The results with every repeated label numbered as a server started again (`plain`,
    `plain` -> `plain`, `plain~2`): runs compared together may each hold a `dcoco@...`."""
    seen: set[str] = set()
    out = []
    for result in results:
        label = result["label"]
        method, at, rest = label.partition("@")
        base, copy = method.split("~")[0], 2
        while label in seen:
            label, copy = f"{base}~{copy}{at}{rest}", copy + 1
        seen.add(label)
        out.append(result if label == result["label"] else {**result, "label": label})
    return out


def pooled(results: list[dict]) -> list[dict] | None:
    """The servers of a method started more than once (`dcoco~2@...` beside `dcoco@...`) as one
    result per method: per level the mean output tok/s and the spread between its servers
    (largest / smallest - 1). None when every method has one server."""
    groups: dict[str, list[dict]] = {}
    for result in results:
        method, _, checkpoint = result["label"].partition("@")
        label = method.split("~")[0] + ("@" + checkpoint if checkpoint else "")
        groups.setdefault(label, []).append(result)
    if all(len(group) == 1 for group in groups.values()):
        return None
    merged = []
    for label, group in groups.items():
        rates: dict[tuple[float, int], list[float]] = {}
        for result in group:
            for level in result["levels"]:
                key = (level["temperature"], level["concurrency"])
                rates.setdefault(key, []).append(level["output_tok_s"])
        levels = [
            {"temperature": t, "concurrency": c, "output_tok_s": sum(r) / len(r),
             "spread": max(r) / min(r) - 1 if min(r) > 0 else float("nan"), "servers": len(r)}
            for (t, c), r in sorted(rates.items())
        ]  # fmt: skip
        merged.append({"label": label, "levels": levels})
    return merged


def method_rates(results: list[dict]) -> dict[tuple[str, float], dict[int, float]]:
    """(row, temperature) -> {concurrency: output tok/s}, a row's servers at their mean (`pooled`):
    the rows the compare tables read, for comparisons across runs."""
    return _rates(pooled(results) or results)


def spread_table(merged: list[dict]) -> str:
    """Markdown: each method's servers, mean tok/s and spread between its servers, per level."""
    levels = sorted({lv["concurrency"] for result in merged for lv in result["levels"]})
    lines = [
        f"| method | T | servers | {' | '.join(f'c={c}' for c in levels)} |",
        "|---|--:|--:|" + "--:|" * len(levels),
    ]
    for result in merged:
        for temperature in sorted({lv["temperature"] for lv in result["levels"]}):
            at = {
                lv["concurrency"]: lv for lv in result["levels"] if lv["temperature"] == temperature
            }
            servers = max(lv["servers"] for lv in at.values())
            cells = [
                f"{at[c]['output_tok_s']:.1f} ({at[c]['spread'] * 100:.1f}%)" if c in at else "-"
                for c in levels
            ]
            lines.append(
                f"| {_row(result['label'])} | {temperature:g} | {servers} | {' | '.join(cells)} |"
            )
    return "\n".join(lines)


def rss_minutes(rss: list) -> list[float]:
    """The server's RSS in MiB at each whole minute of a soak (`rss` [(s, bytes)]), the last
    sample closing the list."""
    if not rss:
        return []
    marks = [t for t, _ in rss]
    picked = [next(b for t, b in rss if t >= m * 60) for m in range(int(marks[-1] // 60) + 1)]
    if marks[-1] % 60:
        picked.append(rss[-1][1])
    return [round(b / 2**20, 1) for b in picked]


def plot_rss(rss: list, title: str, path: Path) -> Path | None:
    """The server's RSS over a soak (`rss` [(s, bytes)]); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot([t / 60 for t, _ in rss], [b / 2**20 for _, b in rss], label="RSS")
    ax.set_xlabel("minutes under load")
    ax.set_ylabel("server RSS, MiB (process tree)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
