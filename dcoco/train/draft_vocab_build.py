"""`dcoco draft-vocab`: write a drafter checkpoint's draft vocabulary (dcoco.models.draft_vocab).

The vocabulary is what the trainers' `--loss-vocab N` trains over: the N most frequent reply tokens
of the corpus less its held-out split (ties by id). The file records the corpus it was counted on
and the share of the held-out replies' tokens it covers (a draft can never propose the rest).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from dcoco.config import Command
from dcoco.data.distill import load_corpus, split_heldout
from dcoco.decode.methods import MethodOptions, MethodSpec, checkpoint_dir
from dcoco.errors import DcocoError
from dcoco.models.draft_vocab import save_draft_vocab
from dcoco.models.drafter_io import read_drafter_config
from dcoco.models.loading import DEFAULT_TARGET
from dcoco.paths import default_corpus, portable


@dataclass
class DraftVocabConfig:
    drafter: str = "dflash"  # checkpoint directory, or a name under checkpoints/<target>/
    target: str = DEFAULT_TARGET  # the target the checkpoint belongs to (names its folder)
    size: int = 16000  # tokens in the vocabulary (the trainers' --loss-vocab)
    corpus: str = ""  # part-*.jsonl dir; empty = the target's shared corpus
    heldout: int = 32  # held-out records, not counted (the split training holds out)


def build(config: DraftVocabConfig) -> tuple[Path, dict[str, str]]:
    """Count, write, and return (file, its metadata)."""
    target = _Named(Path(config.target).name)
    path = checkpoint_dir(MethodSpec("dflash", None, config.drafter), target, MethodOptions())
    drafter_config, _ = read_drafter_config(path)
    vocab = drafter_config.vocab_size
    if not 0 < config.size < vocab:
        raise DcocoError(f"--size must be in 1..{vocab - 1}, got {config.size}")
    corpus = Path(config.corpus or default_corpus(config.target))
    samples = load_corpus(corpus)
    if not samples:
        raise DcocoError(f"no corpus records under {corpus}")
    train, heldout = split_heldout(samples, config.heldout)
    counts = Counter(t for s in train for t in s.response_ids)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[: config.size]
    ids = torch.tensor(sorted(ranked), dtype=torch.int64)
    kept = set(ranked)
    heldout_tokens = [t for s in heldout for t in s.response_ids]
    covered = sum(t in kept for t in heldout_tokens) / max(1, len(heldout_tokens))
    digest = hashlib.sha256(",".join(sorted(s.id for s in train)).encode()).hexdigest()[:16]
    metadata = {
        "size": str(len(ranked)),
        "corpus": portable(corpus),
        "corpus_records": str(len(train)),
        "corpus_ids_digest": digest,
        "heldout_records": str(len(heldout)),
        "heldout_token_coverage": f"{covered:.5f}",
    }
    return save_draft_vocab(path, ids, metadata), metadata


class _Named:
    """What checkpoint_dir reads of a target: its name (no weights are needed here)."""

    def __init__(self, name: str):
        self.name = name


def run(config: DraftVocabConfig) -> int:
    path, metadata = build(config)
    print(
        f"{portable(path)}: {metadata['size']} tokens from {metadata['corpus_records']} records; "
        f"held-out reply tokens covered: {float(metadata['heldout_token_coverage']):.2%}"
    )
    return 0


COMMAND = Command(
    "draft-vocab",
    "write a drafter checkpoint's draft vocabulary (the rows its head scores when decoding)",
    DraftVocabConfig,
    run,
    description=__doc__.split("\n\n")[1],
)
