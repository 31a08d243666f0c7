"""`dcoco datagen` through both engines on the same prompts, in one run: tokens/s of each and the
agreement of their replies (issue 32).

Usage: .venv/bin/python scripts/reproduce/datagen_engines.py [--limit 200] [--tokens 128]
    [--dtype fp32] [--prompts ../shared/data/chat_train_prompts.jsonl]
    [--out results/archive/smollm2-datagen-engines]
The two corpora go under $DCOCO_CACHE_DIR/datagen-engines/ (rerunning resumes them); the folder
gets summary.json and summary.md. Needs `make venv-vllm`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from dcoco.data.distill import load_corpus
from dcoco.paths import cache_dir, data_dir, portable

ENGINES = ("vllm", "hf")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--prompts", default=str(data_dir() / "chat_train_prompts.jsonl"))
    parser.add_argument("--out", default="results/archive/smollm2-datagen-engines")
    args = parser.parse_args()
    work = cache_dir() / "datagen-engines" / f"{args.dtype}-{args.limit}-{args.tokens}"
    runs = {}
    for engine in ENGINES:
        corpus = work / engine
        command = ["datagen", "--engine", engine, "--prompts", args.prompts, "--out", str(corpus),
                   "--limit", str(args.limit), "--max-new-tokens", str(args.tokens),
                   "--dtype", args.dtype]  # fmt: skip
        subprocess.run([sys.executable, "-m", "dcoco", *command], check=True)
        lines = (corpus / "datagen.jsonl").read_text().splitlines()
        runs[engine] = [json.loads(line) for line in lines]
    summary = {
        "prompts": portable(args.prompts),
        "dtype": args.dtype,
        "max_new_tokens": args.tokens,
        "engines": {engine: _rate(records) for engine, records in runs.items()},
        "agreement": agreement(work / "vllm", work / "hf"),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    print(markdown(summary))


def _rate(records: list[dict]) -> dict:
    """Tokens/s over every run that wrote records (a resumed corpus: all of its runs)."""
    done = [r for r in records if r["records"]]
    tokens, seconds = sum(r["new_tokens"] for r in done), sum(r["seconds"] for r in done)
    generate = sum(r.get("generate_seconds", r["seconds"]) for r in done)
    return {
        "version": done[-1]["version"] if done else None,
        "records": sum(r["records"] for r in done),
        "new_tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "tokens_per_s_generating": round(tokens / generate, 1) if generate else None,
    }


def agreement(left: Path, right: Path) -> dict:
    """How far the two corpora's replies to the same ids agree."""
    a = {s.id: s for s in load_corpus(left)}
    b = {s.id: s for s in load_corpus(right)}
    ids = sorted(a.keys() & b.keys())
    same_prompt = sum(a[i].prompt_ids == b[i].prompt_ids for i in ids)
    equal = sum(a[i].response_ids == b[i].response_ids for i in ids)
    prefix, total = 0, 0
    for i in ids:
        x, y = a[i].response_ids, b[i].response_ids
        same = (n for n, (p, q) in enumerate(zip(x, y, strict=False)) if p != q)
        prefix += next(same, min(len(x), len(y)))
        total += max(len(x), len(y))
    return {
        "records": len(ids),
        "same_prompt_ids": same_prompt,
        "equal_replies": equal,
        "common_prefix_share": round(prefix / total, 4) if total else None,
    }


def markdown(summary: dict) -> str:
    head = "| engine | version | records | new tokens | seconds | tokens/s | tokens/s generating |"
    rows = [head, "|---|---|--:|--:|--:|--:|--:|"]
    for engine, r in summary["engines"].items():
        cells = [engine, r["version"], r["records"], r["new_tokens"], r["seconds"],
                 r["tokens_per_s"], r["tokens_per_s_generating"]]  # fmt: skip
        rows.append("| " + " | ".join(map(str, cells)) + " |")
    agree = summary["agreement"]
    title = (f"`dcoco datagen`, {summary['dtype']}, {summary['max_new_tokens']} new tokens, "
             f"greedy, prompts {summary['prompts']}")  # fmt: skip
    closing = (f"Agreement on {agree['records']} records: identical prompt ids "
               f"{agree['same_prompt_ids']}, identical replies {agree['equal_replies']}, common "
               f"reply prefix {agree['common_prefix_share']:.1%} of reply tokens.")  # fmt: skip
    return "\n".join([title, "", *rows, "", closing, ""])


if __name__ == "__main__":
    main()
