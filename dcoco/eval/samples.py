"""`samples.jsonl`: one record per generated turn, the single source every metric is computed from.

A record is flushed as soon as it is written, so a killed run loses at most the sample in flight
and `--resume` continues from the rest. A run split over processes (`dcoco bench --shards N`)
gives each shard its own `samples.shard<k>of<N>.jsonl`; readers take the union of them all.
"""

from __future__ import annotations

import json
from pathlib import Path

from dcoco.errors import DcocoError

SAMPLES_FILE = "samples.jsonl"
SHARD_FILES = "samples.shard*.jsonl"

SampleKey = tuple[str, float, str, str, int]  # method, temperature, suite, id, turn


def sample_key(record: dict) -> SampleKey:
    return (
        record["method"],
        float(record["temperature"]),
        record["suite"],
        record["id"],
        int(record["turn"]),
    )


def samples_file(shard: int = 0, shards: int = 1) -> str:
    """The file one process of a run writes: shards never share a file, so none tears another's
    lines."""
    return SAMPLES_FILE if shards == 1 else f"samples.shard{shard}of{shards}.jsonl"


def sample_files(run_dir: Path) -> list[Path]:
    """The unsharded file, if any, then every shard's."""
    single = Path(run_dir) / SAMPLES_FILE
    return ([single] if single.is_file() else []) + sorted(Path(run_dir).glob(SHARD_FILES))


def read_samples(run_dir: Path) -> list[dict]:
    """Every complete record of `run_dir`, over all its sample files; a torn last line (a run
    killed mid-write) is skipped."""
    files = sample_files(run_dir)
    if not files:
        raise DcocoError(f"no {SAMPLES_FILE} in {run_dir}: is it a `dcoco bench` run directory?")
    return [record for path in files for record in _read_file(path)]


def _read_file(path: Path) -> list[dict]:
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise DcocoError(f"{path}:{number}: not a JSON record") from error
    return records


class SampleWriter:
    """Appends records to one sample file of `run_dir`, one flushed line each."""

    def __init__(self, run_dir: Path, name: str = SAMPLES_FILE):
        self.path = Path(run_dir) / name
        self._drop_torn_tail()
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def _drop_torn_tail(self) -> None:
        """A run killed mid-write leaves half a line; appending after it would corrupt the next."""
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as file:
                file.truncate(data.rfind(b"\n") + 1)

    def close(self) -> None:
        self._file.close()
