"""Sharded `dcoco datagen`: N processes or machines split one prompt set and write one corpus.

A prompt belongs to shard I of N when its id hashes to I mod N: fixed by the ids alone, so the
shards are disjoint and together cover the set whatever order the prompt file has, and each
prompt's reply is the one a single process would write (greedy replies depend on the prompt
only). Shards may write into one directory: shard I of N names its parts `part-IofN-NNNN.jsonl`
(a single process `part-NNNN.jsonl`), and the corpus reader takes every `part-*.jsonl`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from dcoco.errors import DcocoError


def parse_shard(shard: str) -> tuple[int, int]:
    """`I/N` -> (I, N), checked."""
    try:
        index, count = (int(x) for x in shard.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise DcocoError(f"--shard must be I/N with 0 <= I < N, got '{shard}'")
    return index, count


def shard_of(prompts: list[dict], shard: str) -> list[dict]:
    """The prompts of shard `I/N`, in their order."""
    index, count = parse_shard(shard)
    if count == 1:
        return prompts
    return [p for p in prompts if _id_hash(p["id"]) % count == index]


def next_part(out: Path, shard: str = "0/1") -> Path:
    """The next part file this shard writes in `out`."""
    index, count = parse_shard(shard)
    prefix = "part-" if count == 1 else f"part-{index:04d}of{count:04d}-"
    own = re.compile(re.escape(prefix) + r"\d{4}\.jsonl")
    taken = sum(1 for path in out.glob("part-*.jsonl") if own.fullmatch(path.name))
    return out / f"{prefix}{taken:04d}.jsonl"


def _id_hash(record_id: str) -> int:
    return int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:8], "big")
