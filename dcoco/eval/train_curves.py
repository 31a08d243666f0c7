"""`dcoco train-curves`: the held-out learning curves of training runs, side by side.

Reads each run's `train_log.jsonl` (written by `train-drafter` / `train-corrector`) and writes
`curves.md` (one row per run: budget, final held-out loss, slot accuracies, τ, the count-bigram
baseline on the same blocks, gradient norms) and `curves.png` (held-out slot-1 accuracy and τ
against wall-clock time and step). Runs compared on the same data and the same wall-clock
budget make a recipe choice a measurement.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from dcoco.config import Command
from dcoco.errors import DcocoError
from dcoco.eval.run_record import write_run_record


@dataclass
class TrainCurvesConfig:
    runs: tuple[str, ...] = ()  # run directories (each with a train_log.jsonl)
    out: str = "results/train-curves"  # output dir: curves.md, curves.json, curves.png
    num_draft_tokens: int = 3  # drafts per cycle shown in the table's accuracy columns


def read_log(run: Path) -> dict:
    """The events of one run: evals, the bigram baseline, train steps (time from its start)."""
    path = run / "train_log.jsonl"
    if not path.is_file():
        raise DcocoError(f"{run} has no train_log.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    trains = [r for r in records if r["event"] == "train"]
    # Wall-clock of training alone: resumed runs add up their steps, not the gaps between them.
    elapsed, clock = 0.0, {}
    for record in trains:
        elapsed += record.get("step_s", 0.0)
        clock[record["step"]] = elapsed
    evals = [{**r, "seconds": clock.get(r["step"], 0.0)} for r in records if r["event"] == "eval"]
    baseline = next((r for r in records if r["event"] == "baseline"), None)
    return {"name": run.name, "evals": evals, "baseline": baseline, "trains": trains}


def summary_row(log: dict, slots: int) -> dict:
    last = log["evals"][-1] if log["evals"] else None
    norms = [t["grad_norm"] for t in log["trains"] if "grad_norm" in t]
    tail = norms[len(norms) // 2 :]
    return {
        "run": log["name"],
        "steps": last["step"] if last else 0,
        "seconds": round(last["seconds"]) if last else 0,
        "blocks": sum(t.get("blocks", 0) for t in log["trains"]),
        "loss": last.get("loss") if last else None,  # corrector-cache runs log none
        "slot_acc": last["slot_acc"][:slots] if last else [],
        "accept": last["accept"] if last else None,
        "tau_3": last.get("tau_3") if last else None,
        "bigram_slot_acc": log["baseline"]["slot_acc"][:slots] if log["baseline"] else [],
        "grad_norm_median": statistics.median(tail) if tail else None,
    }


def markdown(rows: list[dict], slots: int) -> str:
    head = " / ".join(str(k) for k in range(1, slots + 1))
    lines = [
        f"| run | steps | train s | blocks | held-out loss | slot {head} acc | "
        f"bigram slot {head} | τ (3 slots) | τ (all slots) | median grad norm (2nd half) |",
        "|---|--:|--:|--:|--:|---|---|--:|--:|--:|",
    ]
    for row in rows:
        acc = " / ".join(f"{a:.3f}" for a in row["slot_acc"])
        bigram = " / ".join(f"{a:.3f}" for a in row["bigram_slot_acc"]) or "–"
        loss = f"{row['loss']:.3f}" if row["loss"] is not None else "–"
        accept = f"{row['accept']:.3f}" if row["accept"] is not None else "–"
        tau_3 = f"{row['tau_3']:.3f}" if row["tau_3"] is not None else "–"
        norm = f"{row['grad_norm_median']:.2f}" if row["grad_norm_median"] is not None else "–"
        lines.append(
            f"| {row['run']} | {row['steps']} | {row['seconds']} | {row['blocks']:,} | {loss} | "
            f"{acc} | {bigram} | {tau_3} | {accept} | {norm} |"
        )
    return "\n".join(lines)


def write_plot(logs: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for log in logs:
        xs = [e["seconds"] / 60 for e in log["evals"]]
        line = left.plot(
            xs, [e["slot_acc"][0] for e in log["evals"]], marker="o", label=log["name"]
        )
        right.plot(xs, [e["accept"] for e in log["evals"]], marker="o", color=line[0].get_color())
        if log["baseline"]:
            left.axhline(log["baseline"]["slot_acc"][0], color=line[0].get_color(), ls=":", lw=1)
    left.set(xlabel="training minutes", ylabel="held-out slot-1 accuracy", ylim=(0, None))
    left.set_title("slot 1 (dotted: count bigram)")
    right.set(xlabel="training minutes", ylabel="held-out τ (all slots, simulated)")
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run(config: TrainCurvesConfig) -> int:
    if not config.runs:
        raise DcocoError("give one or more run directories")
    logs = [read_log(Path(r)) for r in config.runs]
    rows = [summary_row(log, config.num_draft_tokens) for log in logs]
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, config.num_draft_tokens)
    (out / "curves.md").write_text(table + "\n")
    curves = {log["name"]: log["evals"] for log in logs}
    (out / "curves.json").write_text(json.dumps({"rows": rows, "curves": curves}, indent=1) + "\n")
    plotted = write_plot(logs, out / "curves.png")
    write_run_record(out, "train-curves", config)
    print(table)
    print(f"curves: {out}" + ("" if plotted else " (no plot: matplotlib missing)"), file=sys.stderr)
    return 0


COMMAND = Command(
    name="train-curves",
    help="compare the held-out learning curves of training runs",
    config=TrainCurvesConfig,
    run=run,
    positional=("runs",),
    renamed={"slots": "num_draft_tokens"},
)
