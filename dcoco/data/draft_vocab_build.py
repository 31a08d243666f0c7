"""`dcoco draft-vocab`: rank the target's reply tokens by count over its distillation corpus, for
the drafter's draft vocabulary (dcoco.models.drafter.draft_vocab).

Reads every part of the corpus present and writes `draft-vocab.safetensors` (token ids by count,
and the counts) and `draft-vocab.json` (each part's digest, the totals, and the held-out coverage
of the sizes a run may pick: rank on the corpus less a held-out tenth, count the tenth's tokens
inside) to `checkpoints/<target>/`. Rerun it when the corpus grows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from dcoco.config import Command
from dcoco.data.distill import corpus_parts, load_corpus, split_heldout
from dcoco.errors import DcocoError
from dcoco.models.drafter.draft_vocab import AUTO_SIZE, coverage, rank_tokens, write_ranking
from dcoco.models.target.loading import DEFAULT_TARGET
from dcoco.paths import checkpoints_dir, default_corpus, portable

SIZES = (2048, 4096, 8192, AUTO_SIZE, 16384, 32768)  # sizes whose held-out coverage is recorded
HELDOUT_SHARE = 10  # one record in this many is held out for the coverage table


@dataclass
class DraftVocabConfig:
    target: str = DEFAULT_TARGET  # the target's name: where the ranking is written and read
    corpus: str = ""  # distillation corpus directory; empty = the shared one of the target
    out: str = ""  # directory to write draft-vocab.* to; empty = checkpoints/<target>


def run(config: DraftVocabConfig) -> int:
    corpus = Path(config.corpus) if config.corpus else default_corpus(config.target)
    parts = corpus_parts(corpus)
    samples = load_corpus(corpus)
    if not samples:
        raise DcocoError(f"corpus {corpus} has no replies")
    ranked, counts = rank_tokens([s.response_ids for s in samples])
    train, heldout = split_heldout(samples, max(1, len(samples) // HELDOUT_SHARE))
    train_ranked, _ = rank_tokens([s.response_ids for s in train])
    replies = [s.response_ids for s in heldout]
    table = {str(size): round(coverage(train_ranked, replies, size), 4) for size in SIZES}
    out = Path(config.out) if config.out else checkpoints_dir() / config.target
    provenance = {
        "target": config.target,
        "corpus": portable(corpus),
        "parts": {part.name: hashlib.sha256(part.read_bytes()).hexdigest()[:16] for part in parts},
        "records": len(samples),
        "reply_tokens": int(counts.sum()),
        "distinct_tokens": len(ranked),
        "heldout_records": len(heldout),
        "heldout_coverage": table,
        "made": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"dcoco draft-vocab --target {config.target}",
    }
    write_ranking(out, ranked, counts, provenance)
    print(f"ranked {len(ranked)} distinct tokens over {len(samples)} replies -> {portable(out)}")
    for size, share in table.items():
        print(f"  top {size:>6}: {share:.2%} of held-out reply tokens")
    return 0


COMMAND = Command(
    name="draft-vocab",
    help="rank the target's reply tokens for the drafter's draft vocabulary",
    config=DraftVocabConfig,
    run=run,
)
