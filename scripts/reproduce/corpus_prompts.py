"""The prompts of a distillation corpus as `dcoco datagen` reads them, to answer them again (the
target's sampled replies, `--temperature 1`, for a drafter that drafts at T = 1).

Writes OUT/train.jsonl (the corpus's training split, shuffled with a fixed seed, so `--limit N`
takes a mix of every source) and OUT/heldout.jsonl (the held-out split `dcoco train-*` and `dcoco
heldout` keep out, by the same id hash). Ids get SUFFIX appended, so a corpus of new replies can be
trained beside the original (`--mix-corpus`) without two records sharing an id.

Usage: .venv/bin/python scripts/reproduce/corpus_prompts.py OUT [SUFFIX] [HELDOUT]
  (defaults: suffix ":t1", 32 held-out records; the shared corpus of SmolLM2)
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from dcoco.data.distill import corpus_parts, load_corpus, split_heldout
from dcoco.models.target.loading import DEFAULT_TARGET
from dcoco.paths import default_corpus


def main(out: Path, suffix: str, heldout_count: int) -> None:
    corpus = default_corpus(DEFAULT_TARGET)
    records = {}
    for part in corpus_parts(corpus):
        for line in part.read_text().splitlines():
            record = json.loads(line)
            records[str(record["id"])] = record
    train, heldout = split_heldout(load_corpus(corpus), heldout_count)
    random.Random(0).shuffle(train)
    out.mkdir(parents=True, exist_ok=True)
    for name, samples in (("train", train), ("heldout", heldout)):
        with (out / f"{name}.jsonl").open("w") as sink:
            for sample in samples:
                record = records[sample.id]
                prompt = {
                    "id": sample.id + suffix,
                    "turns": [record["user"]],
                    "category": record.get("category", ""),
                    "source": record.get("source", ""),
                }
                sink.write(json.dumps(prompt) + "\n")
        print(f"{out / name}.jsonl: {len(samples)} prompts")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        Path(arguments[0]),
        arguments[1] if len(arguments) > 1 else ":t1",
        int(arguments[2]) if len(arguments) > 2 else 32,
    )
