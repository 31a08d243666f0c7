"""A feature cache that makes the target's forward a one-off: tapped hidden states of a whole
distillation corpus, computed once in batches and memory-mapped back for every epoch.

Layout under `<cache dir>/features/<target fingerprint>-<dtype>-taps-<ids>/`, one shard per corpus
part and keyed by that part's bytes, so a corpus that grows only adds shards and an edited part
never hits a stale one:

    part-0007-<sha>.bin    bf16 rows [tokens of every record, taps * hidden], records back to back
    part-0007-<sha>.json   {"records": {id: [row offset, tokens]}, "dims", "rows", ...}

The index is written last (atomically), so a shard without one is a torn write from a killed
build and is redone; a shard whose sizes disagree with its index is reported and redone.
Features are causal, so a record cut to `max_seq_len` later reads a prefix of its rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from dcoco.data.distill import Sample, corpus_parts, part_record_ids, read_part
from dcoco.errors import DcocoError
from dcoco.paths import cache_dir
from dcoco.train.distributed import SINGLE, Ranks, barrier
from dcoco.train.target_features import TargetFeatures

FORMAT_VERSION = 1
PAD_ID = 0  # right padding: causal attention never lets a real token see it


def shard_dir(cache_root: str | Path, target, taps: tuple[int, ...]) -> Path:
    dtype = str(target.dtype).removeprefix("torch.")
    name = f"{target.info.fingerprint}-{dtype}-taps-{'-'.join(str(t) for t in taps)}"
    return Path(cache_root) / "features" / name


def part_key(part: Path) -> str:
    return hashlib.sha256(part.read_bytes()).hexdigest()[:16]


@dataclass
class Shard:
    """One part's rows, opened lazily as a read-only memory map."""

    bin_path: Path
    rows: int
    dims: int
    records: dict[str, tuple[int, int]]  # id -> (row offset, tokens)
    _map: np.memmap | None = None

    def rows_of(self, record_id: str, tokens: int) -> Tensor:
        """The first `tokens` rows of a record as a bf16 tensor [tokens, dims] (a copy)."""
        if self._map is None:
            self._map = np.memmap(self.bin_path, dtype=np.int16, mode="r").reshape(-1, self.dims)
        offset, stored = self.records[record_id]
        if tokens > stored:
            raise DcocoError(
                f"feature cache holds {stored} tokens of record {record_id}, not {tokens}"
            )
        block = np.array(self._map[offset : offset + tokens])
        return torch.from_numpy(block).view(torch.bfloat16)


def _load_index(bin_path: Path) -> Shard | None:
    """The shard at `bin_path` if its index is present and its sizes agree, else None."""
    index_path = bin_path.with_suffix(".json")
    if not index_path.is_file():
        return None
    try:
        index = json.loads(index_path.read_text())
        records = {k: (int(v[0]), int(v[1])) for k, v in index["records"].items()}
        rows, dims = int(index["rows"]), int(index["dims"])
        ok = index["version"] == FORMAT_VERSION and bin_path.stat().st_size == rows * dims * 2
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        print(
            f"dcoco: feature shard {bin_path.name} is corrupt or stale; rebuilding it",
            file=sys.stderr,
        )
        return None
    return Shard(bin_path, rows, dims, records)


def length_batches(samples: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """Length-sorted batches whose padded size stays within `max_tokens` (one long record may
    exceed it alone)."""
    batches, current = [], []
    for sample in sorted(samples, key=lambda s: s.num_tokens):
        if current and sample.num_tokens * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(sample)
    return [*batches, current] if current else batches


def _build_shard(target, taps, samples, bin_path: Path, batch_tokens: int, bar) -> Shard:
    dims = len(taps) * target.info.hidden_size
    offsets, row = {}, 0
    for sample in samples:
        offsets[sample.id] = (row, sample.num_tokens)
        row += sample.num_tokens
    # Per-process staging names: two builders of one part (a background job and a trainer) each
    # write their own file and the last rename wins, both complete.
    staging = bin_path.with_suffix(f".{os.getpid()}.partial")
    out = np.memmap(staging, dtype=np.int16, mode="w+", shape=(max(row, 1), dims))
    for batch in length_batches(samples, batch_tokens):
        width = max(s.num_tokens for s in batch)
        ids = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
        for i, sample in enumerate(batch):
            ids[i, : sample.num_tokens] = torch.tensor(sample.input_ids)
        features = target.forward(ids.to(target.device), feature_layers=taps, with_logits=False)
        rows = features.features.to(torch.bfloat16).cpu().view(torch.int16).numpy()
        for i, sample in enumerate(batch):
            offset, length = offsets[sample.id]
            out[offset : offset + length] = rows[i, :length]
        bar.update(sum(s.num_tokens for s in batch))
    out.flush()
    del out
    os.replace(staging, bin_path)
    index = {"version": FORMAT_VERSION, "rows": row, "dims": dims, "records": offsets}
    index_staging = bin_path.with_suffix(f".{os.getpid()}.json.partial")
    index_staging.write_text(json.dumps(index))
    os.replace(index_staging, bin_path.with_suffix(".json"))
    return Shard(bin_path, row, dims, offsets)


class FeatureCache:
    """Cached taps for every record of a corpus: `features(sample)` -> [1, tokens, taps * hidden]
    on the target's device, in the target's dtype (the same interface as TargetFeatures)."""

    def __init__(self, shards: dict[str, Shard], device, dtype, online=None):
        self.shards = shards  # record id -> its shard
        self.device = device
        self.dtype = dtype
        self.online = online  # TargetFeatures for records outside the cached parts, or None

    def __call__(self, sample: Sample) -> Tensor:
        shard = self.shards.get(sample.id)
        if shard is None and self.online is not None:
            return self.online(sample)
        if shard is None:
            raise DcocoError(f"record {sample.id} is not in the feature cache; rebuild it")
        rows = shard.rows_of(sample.id, sample.num_tokens)
        return rows.to(device=self.device, dtype=self.dtype)[None]

    def __contains__(self, sample: Sample) -> bool:
        return sample.id in self.shards


def build_feature_cache(
    target,
    taps: tuple[int, ...],
    corpus: str | Path,
    cache_root: str | Path,
    batch_tokens: int = 4096,
    progress_bar: bool = True,
    needed: set[str] | None = None,
    ranks: Ranks = SINGLE,
) -> FeatureCache:
    """Compute the shards of every corpus part not cached yet, then open all of them; with
    `needed` (record ids), only the parts holding one of them. In a data-parallel run the
    missing parts are shared out (part i to rank i mod world) and every rank opens them all.

    Records are cached whole, up to the target's context; a killed build resumes part by part.
    """
    parts = corpus_parts(corpus)
    if needed is not None:
        parts = [p for p in parts if needed & {s.id for s in read_part(p)}]
    root = shard_dir(cache_root, target, taps)
    root.mkdir(parents=True, exist_ok=True)
    shards, missing = {}, []
    for part in parts:
        bin_path = root / f"{part.stem}-{part_key(part)}.bin"
        shard = _load_index(bin_path)
        if shard is None:
            missing.append((part, bin_path))
        else:
            shards[part.stem] = shard
    barrier(ranks)  # every rank has seen the same parts missing before any is built
    if ranks.share(missing):
        _build_missing(target, taps, ranks.share(missing), shards, batch_tokens, progress_bar)
    barrier(ranks)
    for part, bin_path in missing:
        shards[part.stem] = shards.get(part.stem) or _load_index(bin_path)
        if shards[part.stem] is None:
            raise DcocoError(f"the feature cache of {part.name} was not built; rerun the command")
    by_record = {rid: shard for shard in shards.values() for rid in shard.records}
    return FeatureCache(by_record, target.device, target.dtype)


def _build_missing(target, taps, missing, shards, batch_tokens, progress_bar) -> None:
    loaded = [(part, path, read_part(part, target.max_context)) for part, path in missing]
    total = sum(s.num_tokens for _, _, samples in loaded for s in samples)
    check_room(missing[0][1].parent, total * len(taps) * target.info.hidden_size * 2)
    print(
        f"dcoco: caching target features of {len(loaded)} corpus parts ({total:,} tokens) "
        f"under {missing[0][1].parent}",
        file=sys.stderr,
    )
    start = time.perf_counter()
    with tqdm(total=total, unit="tok", unit_scale=True, disable=not progress_bar) as bar:
        for part, bin_path, samples in loaded:
            shards[part.stem] = _build_shard(target, taps, samples, bin_path, batch_tokens, bar)
            bar.write(f"dcoco: cached {part.name} ({len(samples)} records)")
    rate = total / max(time.perf_counter() - start, 1e-9)
    print(f"dcoco: feature cache complete ({rate:,.0f} tokens/s)", file=sys.stderr)


def check_room(root: Path, needed: int) -> None:
    """Refuse, in one line and before writing anything, a cache the disk cannot hold (with a
    tenth spare): at a real target's width it is tens of KiB a token."""
    free = shutil.disk_usage(root).free
    if needed * 1.1 > free:
        raise DcocoError(
            f"the feature cache needs {needed / 2**30:,.1f} GiB under {root} and the disk has "
            f"{free / 2**30:,.1f} GiB free: pass --feature-cache off (features computed every "
            "step), --cache-parts N or --max-records N, or a --feature-cache root with room"
        )


def open_features(
    config, target, taps: tuple[int, ...], samples: list[Sample] | None, ranks: Ranks = SINGLE
):
    """The features a training run reads over `samples` (None: records passed in directly, not
    read from `config.corpus`): the corpus's feature cache under `--feature-cache` (empty: the
    cache dir), built where missing; or computed online for records passed in or with
    `--feature-cache off`."""
    if samples is None or config.feature_cache == "off":
        return TargetFeatures(target, taps)
    root = config.feature_cache or cache_dir()
    needed = {s.id for s in samples} if config.max_records else None
    if not config.cache_parts:
        return build_feature_cache(target, taps, config.corpus, root, needed=needed, ranks=ranks)
    # Only the parts trained on are cached; the held-out records in later parts (a few dozen,
    # read once when the run starts) are computed online.
    trained = part_record_ids(config.corpus, config.cache_parts)
    cache = build_feature_cache(
        target,
        taps,
        config.corpus,
        root,
        needed=needed & trained if needed else trained,
        ranks=ranks,
    )
    cache.online = TargetFeatures(target, taps)
    return cache
