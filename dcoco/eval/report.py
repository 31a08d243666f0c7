"""report.md (+ summary.json and the plots) of a bench run, rebuilt from its samples.jsonl alone.

`dcoco bench-report RUN_DIR` regenerates them, e.g. after a metric or a table changes.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from dcoco.config import Command
from dcoco.eval.metrics import CYCLE_PARTS, summarize
from dcoco.eval.plots import write_plots
from dcoco.eval.samples import read_samples

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"

DEFINITIONS = """\
## Definitions

* **τ (acceptance length)**: tokens emitted per verify cycle (one target forward), the
  bonus/corrected token included: a cycle that accepts n drafts emits n + 1 tokens, so plain
  decoding has τ = 1. *τ* is the mean over samples of each sample's τ; *τ pooled* is Σ tokens
  emitted by cycles / Σ cycles over all samples (long answers weigh more).
* **speedup**: the baseline's time per new token divided by the method's, each pooled
  (Σ seconds / Σ new tokens, prefill included) over the prompt turns both ran. The baseline is
  plain decoding through the same engine, run interleaved with the method on the same machine.
* **match rate** (T = 0 only): the share of samples whose new tokens equal the baseline's exactly.
  Speculative decoding is lossless, so below 100% means numerics (bf16 kernels see different
  batch shapes), not a different output distribution; fp32 should give 100%.
* **per-position acceptance**: for draft slot i, P(slot i accepted | slots 1..i-1 accepted),
  pooled as Σ accepted_i / Σ reached_i over every cycle of every sample (the table gives
  Σ reached_i in brackets).
* **cycle split**: decode time (prefill excluded) per cycle, split into draft (the proposer's
  drafter pass), correct (a draft head's correction/selection after it: the DCOCO corrector's
  one batched op, or a sequential head's slot-by-slot loop), verify (target forward + acceptance
  test) and other (sampling, bookkeeping on the host).
* **tok/s**: Σ new tokens / Σ request seconds (prefill + decode).
"""


@dataclass
class ReportConfig:
    run_dir: str = ""  # a `dcoco bench` run directory (holds its sample files)
    plots: bool = True  # write PNG figures beside report.md


def run(config: ReportConfig) -> int:
    path = build_report(Path(config.run_dir), plots=config.plots)
    print(f"report: {path}", file=sys.stderr)
    return 0


COMMAND = Command(
    "bench-report",
    "rebuild summary.json, report.md and plots of a bench run",
    ReportConfig,
    run,
    positional=("run_dir",),
)


def build_report(run_dir: Path, plots: bool = True) -> Path:
    """summary.json, the plots and report.md of `run_dir`; returns the report's path."""
    summary = summarize(read_samples(run_dir))
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    figures = write_plots(run_dir, summary) if plots else {}
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else None
    path = run_dir / REPORT_FILE
    path.write_text(render(run_dir.name, summary, config, figures))
    return path


def render(name: str, summary: dict, config: dict | None, figures: dict | None) -> str:
    lines = [f"# Benchmark report: {name}", "", *_setup(summary, config), "", DEFINITIONS]
    if figures is None:
        lines += ["*(plots skipped: install matplotlib, `pip install dcoco[plot]`)*", ""]
    for tkey, per_method in summary["results"].items():
        lines += [f"## T = {tkey}", "", "### Overall", "", *overall_table(summary, tkey), ""]
        columns = [*summary["suites"], "overall"]
        lines += ["### τ per suite", "", *_grid(per_method, columns, _tau_cell), ""]
        if summary["baseline"]:
            lines += [f"### Speedup per suite (vs {summary['baseline']})", ""]
            lines += [*_grid(per_method, columns, _speedup_cell), ""]
        lines += ["### Per category (τ / speedup)", ""]
        lines += [*_grid(per_method, summary["categories"], _both_cell, by="categories"), ""]
        lines += ["### Cycle time split (all suites)", "", *_split_table(per_method), ""]
        lines += ["### Acceptance length (share of cycles)", "", *_hist_table(per_method), ""]
        lines += ["### Per-position acceptance (all suites)", "", *_position_table(per_method), ""]
        for caption, file in (figures or {}).get(tkey, []):
            lines += [f"![{caption}]({file})", ""]
    return "\n".join(lines)


def console_summary(summary: dict) -> str:
    """The overall table per temperature, for the terminal."""
    blocks = []
    for tkey in summary["results"]:
        blocks.append("\n".join([f"T = {tkey}", *overall_table(summary, tkey)]))
    return "\n\n".join(blocks)


def overall_table(summary: dict, tkey: str) -> list[str]:
    baseline = summary["baseline"] or "baseline"
    rows = [
        f"| method | samples | new tokens | tok/s | τ | τ pooled | cycle ms | speedup | "
        f"match vs {baseline} |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for method, entry in summary["results"][tkey].items():
        m = entry["overall"]
        rows.append(
            f"| {method} | {m['samples']} | {m['new_tokens']} | {m['tokens_per_s']:.1f} | "
            f"{_num(m['tau'])} | {_num(m['tau_pooled'])} | {m['cycle_split']['cycle_ms']:.1f} | "
            f"{_times(m['speedup'])} | {_percent(m['match_rate'])} |"
        )
    return rows


INT8_NOTE = (
    "**int8 is a different target**: weight-only int8 quantisation of every linear layer "
    "(dcoco.models.target.precision), so compare its speedups with plain decoding at int8 only."
)


def _setup(summary: dict, config: dict | None) -> list[str]:
    lines = [f"Methods: {', '.join(summary['methods'])}; baseline: {summary['baseline'] or '–'}."]
    if config:
        c, first = config["config"], config["sessions"][0]
        machine = first.get("machine") or {"cpu": first["cpu"]}  # older runs: the CPU model only
        cpu = " ".join([machine["cpu"], *machine.get("flags", [])])
        lines += [
            f"Target `{first['target']}` ({first['dtype']}, {first['device']}"
            f"{', ' + first['gpu'] if first.get('gpu') else ''}), CPU {cpu}, "
            f"{first['torch_threads']} torch threads; max new tokens {c['max_new_tokens']}, "
            f"up to {c['limit'] or 'all'} prompts per suite, chat template {c['chat']}.",
            f"Started {first['started']}, git commit {first['git_commit'] or 'unknown'}, "
            f"{len(config['sessions'])} session(s).",
        ]
        if first["dtype"] == "int8":
            lines.append(INT8_NOTE)
        precisions = first.get("precisions") or {}
        if any(p != first["dtype"] for p in precisions.values()):
            rows = ", ".join(f"{row} {p}" for row, p in precisions.items())
            lines.append(f"Rows at their own precision (weights): {rows}.")
    return lines


def _grid(per_method: dict, columns: list[str], cell, by: str = "suites") -> list[str]:
    """Methods x columns; column "overall" reads the run-wide entry."""
    rows = [f"| method | {' | '.join(columns)} |", "|---|" + "--:|" * len(columns)]
    for method, entry in per_method.items():
        cells = [cell(entry["overall"] if c == "overall" else entry[by][c]) for c in columns]
        rows.append(f"| {method} | {' | '.join(cells)} |")
    return rows


def _split_table(per_method: dict) -> list[str]:
    ms = " | ".join(f"{part} ms" for part in CYCLE_PARTS)
    shares = " | ".join(CYCLE_PARTS)
    rows = [
        f"| method | cycle ms | {ms} | {shares} |",
        "|---|" + "--:|" * (1 + 2 * len(CYCLE_PARTS)),
    ]
    for method, entry in per_method.items():
        split = entry["overall"]["cycle_split"]
        cells = [f"{split['cycle_ms']:.2f}"]
        cells += [f"{split[f'{part}_ms']:.2f}" for part in CYCLE_PARTS]
        cells += [_percent(split[part]) for part in CYCLE_PARTS]
        rows.append(f"| {method} | {' | '.join(cells)} |")
    return rows


def _hist_table(per_method: dict) -> list[str]:
    hists = {m: e["overall"]["accept_hist"] for m, e in per_method.items()}
    lengths = sorted({int(length) for hist in hists.values() for length in hist})
    rows = [f"| method | {' | '.join(map(str, lengths))} |", "|---|" + "--:|" * len(lengths)]
    for method, hist in hists.items():
        counts = {int(length): count for length, count in hist.items()}
        cycles = sum(counts.values())
        cells = [_percent(counts.get(n, 0) / cycles if cycles else None) for n in lengths]
        rows.append(f"| {method} | {' | '.join(cells)} |")
    return rows


def _position_table(per_method: dict) -> list[str]:
    """P(slot i accepted | slots before it accepted), with how many cycles reached slot i."""
    drafting = {
        method: (m["per_position_acceptance"], m["per_position_reached"])
        for method, entry in per_method.items()
        if (m := entry["overall"])["per_position_acceptance"]
    }
    slots = max((len(rates) for rates, _ in drafting.values()), default=0)
    rows = [
        f"| method | {' | '.join(f'slot {i + 1}' for i in range(slots))} |",
        "|---|" + "--:|" * slots,
    ]
    for method, (rates, reached) in drafting.items():
        cells = [
            f"{_percent(rates[i])} ({reached[i]})" if i < len(rates) else "–" for i in range(slots)
        ]
        rows.append(f"| {method} | {' | '.join(cells)} |")
    return rows


def _tau_cell(entry: dict) -> str:
    return _num(entry["tau"])


def _speedup_cell(entry: dict) -> str:
    return _times(entry["speedup"])


def _both_cell(entry: dict) -> str:
    return f"{_num(entry['tau'])} / {_times(entry['speedup'])}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"
