"""The report's figures (PNG), drawn from summary.json: τ and speedup per suite, acceptance curves.

matplotlib is an optional dependency (`pip install dcoco[plot]`): it is imported only here, with
the Agg backend, so the report works on headless machines and without it (tables only).
"""

from __future__ import annotations

from pathlib import Path

Figure = tuple[str, str]  # caption, file name (relative to the run directory)


def write_plots(run_dir: Path, summary: dict) -> dict[str, list[Figure]] | None:
    """Figures per temperature key; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figures: dict[str, list[Figure]] = {}
    for tkey, per_method in summary["results"].items():
        methods = list(per_method)
        columns = [*summary["suites"], "overall"]
        made = []
        taus = {m: [_slice(per_method[m], c).get("tau") for c in columns] for m in methods}
        name = f"tau_per_suite_T{tkey}.png"
        _grouped_bars(plt, run_dir / name, columns, taus, "τ (tokens per verify cycle)", tkey)
        made.append((f"τ per suite, T = {tkey}", name))

        baseline = summary["baseline"]
        others = [m for m in methods if m != baseline]
        if baseline and others:
            speedups = {
                m: [_slice(per_method[m], c).get("speedup") for c in columns] for m in others
            }
            name = f"speedup_per_suite_T{tkey}.png"
            _grouped_bars(plt, run_dir / name, columns, speedups, f"speedup vs {baseline}", tkey)
            made.append((f"speedup per suite, T = {tkey}", name))

        curves = {m: per_method[m]["overall"]["per_position_acceptance"] for m in methods}
        curves = {m: rates for m, rates in curves.items() if rates}  # plain drafts nothing
        if curves:
            name = f"acceptance_per_position_T{tkey}.png"
            _curves(plt, run_dir / name, curves, tkey)
            made.append((f"per-position acceptance, T = {tkey}", name))
        figures[tkey] = made
    return figures


def _slice(per_method: dict, column: str) -> dict:
    return per_method["overall"] if column == "overall" else per_method["suites"][column]


def _grouped_bars(plt, path: Path, columns: list[str], values: dict, ylabel: str, tkey: str):
    """One group of bars per column (suite), one bar per method; a missing value draws none."""
    fig, ax = plt.subplots(figsize=(min(16.0, 4 + 0.3 * len(columns) * len(values)), 4))
    width = 0.8 / max(1, len(values))
    for index, (method, heights) in enumerate(values.items()):
        xs = [c + (index - (len(values) - 1) / 2) * width for c in range(len(columns))]
        ax.bar(xs, [h if h is not None else 0.0 for h in heights], width, label=method)
    if "speedup" in ylabel:
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")  # break-even
    ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel}, T = {tkey}")
    ax.margins(y=0.2)  # headroom, so that the legend does not cover the tallest bars
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _curves(plt, path: Path, curves: dict[str, list[float]], tkey: str):
    fig, ax = plt.subplots(figsize=(6, 4))
    slots = max((len(rates) for rates in curves.values()), default=0)
    ax.set_xticks(range(1, slots + 1))  # slots are whole numbers; no 1.25 ticks
    for method, rates in curves.items():
        ys = [float("nan") if rate is None else rate for rate in rates]  # unreached: a gap
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=method)
    ax.set_xlabel("draft position (slot)")
    ax.set_ylabel("P(accepted | earlier slots accepted)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"per-position acceptance, T = {tkey}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
