"""Write results/INDEX.md: every committed run under results/, with what it was measured with.

Layout. results/ holds at most 30 folders (archive/ counts as one). A run that the README, the docs,
the checkpoint catalogue or the code cite as current sits at the top, as results/<run>/. The runs
of one experiment (its reruns and variants) live in a group folder named for the experiment, each
under its own name: results/<group>/<run>/. A group folder holds a GROUP.md (its title, then what
its runs measured) and nothing but runs; it is not a run. Superseded runs live in
results/archive/<run>/, under their own names.

Runs. A run is a folder at the top of results/, of a group or of archive/; its subfolders belong to
it (a bench's shards, a served sweep's arms). One with a `run.json` (dcoco.eval.run_record: written
by heldout, bench, bench-serve, coverage, train-curves and soak), or whose subfolders hold them (a
bench-serve sweep writes one per arm), is listed with the date, commit, machine, precision,
checkpoint digests and command of its records. A legacy run predates run records: its date,
commit, machine and command come from results/legacy.json (the last change of its files in git
before results/ was regrouped, a move being no change; the machine docs/lab/results.md or
scripts/reproduce/README.md names for it, "–" where none does), or else from its last change in git;
its precision from its own config, if it names one.

Usage (from the repository root):
    .venv/bin/python scripts/reproduce/results_index.py          # rewrites results/INDEX.md
    .venv/bin/python scripts/reproduce/results_index.py --check  # exit 1 if INDEX.md is stale or
                                                                 # results/ has over 30 folders
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
ARCHIVE = RESULTS / "archive"
INDEX = RESULTS / "INDEX.md"
LEGACY = RESULTS / "legacy.json"
MAX_TOP_FOLDERS = 30
GROUP_FILE = "GROUP.md"
HEADER = "| run | kind | date | commit | machine | precision | checkpoints | command |"


def _folders(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))


def _runs(parent: Path) -> tuple[list[Path], list[Path]]:
    """The runs directly in parent, and its group folders."""
    folders = [p for p in _folders(parent) if p != ARCHIVE]
    groups = [p for p in folders if (p / GROUP_FILE).is_file()]
    return [p for p in folders if p not in groups], groups


def _git_last_change(folder: Path) -> tuple[str, str]:
    done = subprocess.run(
        ["git", "log", "-1", "--format=%cs %h", "--", str(folder)], cwd=ROOT,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    parts = done.stdout.split()
    return (parts[0], parts[1]) if len(parts) == 2 else ("uncommitted", "–")


def _legacy_precision(folder: Path) -> str:
    for name in ("config.json", "heldout.json", "coverage.json"):
        path = folder / name
        if path.is_file():
            value = json.loads(path.read_text())
            for key in ("config", "dtype"):
                value = value.get(key, {}) if isinstance(value, dict) else {}
            if isinstance(value, str):
                return value
    return "–"


def _cells(values: list[str], sep: str = ", ") -> str:
    return sep.join(dict.fromkeys(v for v in values if v and v != "–")) or "–"


def _command(record: dict) -> str:
    argv = record["argv"] or [record["command"]]
    program = "dcoco" if argv[0].endswith("dcoco") else f"python {argv[0]}"
    return " ".join([program, *argv[1:]])


def _record_row(link: str, records: list[dict]) -> list[str]:
    kinds = _cells([r["command"] for r in records])
    if len(records) > 1:
        kinds += f" ({len(records)} records)"
    dates = sorted(r["date"][:10] for r in records)
    date = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    commits = _cells(
        [(r["commit"] or "–")[:7] + (" (dirty)" if r.get("dirty") else "") for r in records]
    )
    machines = []
    for record in records:
        machine = record["machine"]
        flags = ", ".join(machine["flags"]) or "no AVX2"
        machines.append(f"{machine['cpu']} ({flags}, {machine['cores']} cores)")
    precision = _cells(
        [r["config"].get("dtype") or r["config"].get("target_dtype") or "–" for r in records]
    )
    digests = _cells(
        [f"{k}: {(v or '?')[:8]}" for r in records for k, v in r["checkpoints"].items()]
    )
    commands = list(dict.fromkeys(_command(r) for r in records))
    command = f"`{commands[0]}`"
    if len(commands) > 1:
        command += f" (and {len(commands) - 1} more: the run.json files under {link})"
    return [link, kinds, date, commits, _cells(machines, "; "), precision, digests, command]


def _row(folder: Path, legacy: dict[str, dict]) -> str:
    name = folder.relative_to(RESULTS).as_posix()
    link = f"[{folder.name}]({name}/)"
    top = folder / "run.json"
    paths = [top] if top.is_file() else sorted(folder.rglob("run.json"))
    if paths:
        records = [json.loads(path.read_text()) for path in paths]
        cells = _record_row(link, records)
    else:
        known = legacy.get(f"results/{name}")
        date, commit = (known["date"], known["commit"]) if known else _git_last_change(folder)
        machine = known.get("machine", "–") if known else "–"
        command = known.get("command", "–") if known else "–"
        cells = [link, "legacy", date, commit, machine, _legacy_precision(folder), "–", command]
    return "| " + " | ".join(cells) + " |"


def _group_title(group: Path) -> str:
    first = (group / GROUP_FILE).read_text().splitlines()[0]
    return first.lstrip("#").strip()


def _section(title: str, runs: list[Path], legacy: dict[str, dict]) -> list[str]:
    return ["", title, "", HEADER, "|---|---|---|---|---|---|---|---|"] + [
        _row(run, legacy) for run in runs
    ]


def render() -> tuple[str, int]:
    """INDEX.md's text and the number of runs it lists."""
    legacy = json.loads(LEGACY.read_text()) if LEGACY.is_file() else {}
    top_runs, groups = _runs(RESULTS)
    lines = [
        "# Results ledger",
        "",
        "Every run committed under results/, generated by `scripts/reproduce/results_index.py`",
        "(`--check` tells whether this file is current). Layout: the runs the README, the docs,",
        "the checkpoint catalogue or the code cite as current sit at the top (`results/<run>/`);",
        "the reruns and variants of one experiment live in a group folder named for it, each run",
        "under its own name (`results/<group>/<run>/`, the group's GROUP.md says what they",
        "measured); superseded runs are in `results/archive/<run>/`. At most 30 folders sit at",
        "the top of results/.",
        "",
        "A run's row comes from its `run.json` (a served sweep's from its arms' records, counted",
        "in the kind column). Legacy runs predate run records: their date and commit are those",
        "of their last change in git before the regrouping, and their machine and command those",
        "docs/lab/results.md and scripts/reproduce/README.md give, from results/legacy.json.",
        "Checkpoints are named with their drafter digest (dcoco.models.drafter.catalogue).",
    ]
    count = len(top_runs)
    lines += _section(f"## Current runs ({len(top_runs)})", top_runs, legacy)
    for group in groups:
        runs = _folders(group)  # a group holds runs only
        count += len(runs)
        name = group.name
        title = f"## [{name}/]({name}/{GROUP_FILE}): {_group_title(group)} ({len(runs)} runs)"
        lines += _section(title, runs, legacy)
    if ARCHIVE.is_dir():
        runs, archived_groups = _runs(ARCHIVE)
        count += len(runs)
        lines += _section(f"## [archive/](archive/): superseded ({len(runs)} runs)", runs, legacy)
        for group in archived_groups:
            runs = _folders(group)
            count += len(runs)
            title = f"## [archive/{group.name}/](archive/{group.name}/{GROUP_FILE}): "
            lines += _section(title + _group_title(group), runs, legacy)
    return "\n".join(lines) + "\n", count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true",
        help="exit 1 if results/INDEX.md is stale or results/ has more than 30 folders",
    )  # fmt: skip
    args = parser.parse_args()
    text, count = render()
    if args.check:
        problems = []
        top = len(_folders(RESULTS))
        if top > MAX_TOP_FOLDERS:
            problems.append(
                f"results/ has {top} folders at its top (at most {MAX_TOP_FOLDERS}: "
                "group reruns into results/<group>/<run>/, or archive superseded runs)"
            )
        if not INDEX.is_file() or INDEX.read_text() != text:
            problems.append(
                "results/INDEX.md is stale: run .venv/bin/python scripts/reproduce/results_index.py"
            )
        if problems:
            print("; ".join(problems), file=sys.stderr)
            sys.exit(1)
        return
    INDEX.write_text(text)
    print(f"{INDEX.relative_to(ROOT)}: {count} runs")


if __name__ == "__main__":
    main()
