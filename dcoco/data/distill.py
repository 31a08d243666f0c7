"""The distillation corpus: the target's own greedy replies, as token ids.

A corpus is a directory of `part-*.jsonl` files, one record a line:
`{"id", "prompt_ids", "response_ids", ...}` (other keys are ignored). The corpus grows while it is
being generated, so every part present is read, in name order.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from dcoco.errors import DcocoError


@dataclass(frozen=True)
class Sample:
    id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]

    @property
    def input_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.response_ids]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def corpus_parts(directory: str | Path) -> list[Path]:
    """The `part-*.jsonl` files of a corpus directory, in name order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DcocoError(f"corpus directory {directory} does not exist")
    parts = sorted(directory.glob("part-*.jsonl"))
    if not parts:
        raise DcocoError(f"corpus directory {directory} has no part-*.jsonl files")
    return parts


def read_part(part: Path, max_tokens: int | None = None) -> list[Sample]:
    """The records of one part file; `max_tokens` cuts each sequence (prompt + response) to that
    length by shortening the response, dropping records left with no response."""
    samples: list[Sample] = []
    with part.open() as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            sample = _parse(line, f"{part}:{number}")
            if max_tokens is not None:
                keep = max_tokens - len(sample.prompt_ids)
                if keep <= 0:
                    continue
                sample = Sample(sample.id, sample.prompt_ids, sample.response_ids[:keep])
            if sample.response_ids:
                samples.append(sample)
    return samples


def part_record_ids(directory: str | Path, parts: int) -> frozenset[str]:
    """The ids of the records in the corpus's first `parts` parts."""
    return frozenset(s.id for part in corpus_parts(directory)[:parts] for s in read_part(part))


def load_corpus(
    directory: str | Path, max_records: int | None = None, max_tokens: int | None = None
) -> list[Sample]:
    """Read the records of every `part-*.jsonl` in `directory` (see `read_part`); `max_records`
    stops after that many records."""
    samples: list[Sample] = []
    for part in corpus_parts(directory):
        samples.extend(read_part(part, max_tokens))
        if max_records is not None and len(samples) >= max_records:
            return samples[:max_records]
    return samples


def _parse(line: str, where: str) -> Sample:
    try:
        record = json.loads(line)
        return Sample(
            id=str(record["id"]),
            prompt_ids=tuple(int(t) for t in record["prompt_ids"]),
            response_ids=tuple(int(t) for t in record["response_ids"]),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise DcocoError(f"{where}: not a corpus record ({error})") from error


def _rank(sample: Sample) -> str:
    return hashlib.sha1(sample.id.encode()).hexdigest()


def split_heldout(samples: list[Sample], count: int) -> tuple[list[Sample], list[Sample]]:
    """(train, held-out): the held-out set is the `count` samples whose id hashes lowest.

    Hashing ids (not positions) keeps the split stable as parts are appended to the corpus: a new
    record only enters the held-out set by displacing the highest-ranked one.
    """
    heldout_ids = {s.id for s in sorted(samples, key=_rank)[:count]}
    train = [s for s in samples if s.id not in heldout_ids]
    heldout = sorted((s for s in samples if s.id in heldout_ids), key=_rank)
    return train, heldout
