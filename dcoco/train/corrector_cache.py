"""The corrector cache: a frozen drafter's per-block outputs over a whole corpus, computed once, so
a drop-in head trains without the target or the drafter in the loop.

A drop-in head (dcoco.models.heads.base) reads only what the drafter's one pass produced. With the
drafter frozen that pass is the same every epoch, so it is run once per block and stored:

    hidden          [blocks, slots, hidden] bf16: the drafter's final hidden states (mask slots)
    hint_ids        [blocks, slots] int32: the copy hints the slots read (NO_HINT where none)
    anchor_ids      [blocks] int32;  label_ids [blocks, slots] int32: the target's tokens
    candidate_ids   [blocks, slots, K] int32: the full-vocabulary top-K of the (gated) logits
    candidate_logits, label_logits, logsumexp: fp32 [blocks, slots, K], [blocks, slots] x 2

Full logits are `drafter.logits(hidden, hint_ids)` again (the sequential heads need them).
Layout: `<cache dir>/corrector/<drafter weights>-<target fingerprint>-<dtype>-s<stride>-k<K>/`,
one shard per corpus part, keyed by the part's bytes (`part-0007-<sha>.pt`), holding that part's
training records' blocks at every `stride`-th reply position; and `heldout-<sha>.pt`, the blocks
`dcoco heldout` measures (its records and anchors). A shard is written to a staging name and
renamed, so a killed build leaves no torn shard; a shard that does not load is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from dcoco.config import Command
from dcoco.data.distill import Sample, corpus_parts, read_part, split_heldout
from dcoco.decode.methods import MethodOptions, MethodSpec, checkpoint_dir
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_io import WEIGHTS_FILE, load_drafter
from dcoco.models.target.loading import DEFAULT_TARGET, load_target
from dcoco.paths import cache_dir, default_corpus, portable
from dcoco.train.block_pass import AnchorRule, Item, block_chunks
from dcoco.train.feature_cache import length_batches, part_key

FORMAT_VERSION = 1
FIELDS = (
    "hidden",
    "hint_ids",
    "anchor_ids",
    "label_ids",
    "candidate_ids",
    "candidate_logits",
    "label_logits",
    "logsumexp",
)
HELDOUT_ANCHORS = 64  # dcoco heldout's default anchors per record (its seed-0 generator)


@dataclass(frozen=True)
class CacheSpec:
    """What a cache holds: whose outputs, over which blocks."""

    drafter_digest: str  # sha256[:16] of the drafter's weights file
    stride: int  # every stride-th reply position is an anchor
    top_k: int  # candidates stored per slot
    heldout_records: int  # the held-out split (by id hash) left out of the training shards


def weights_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as weights:
        for chunk in iter(lambda: weights.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def cache_root(root: Path, spec: CacheSpec, target, dtype: torch.dtype) -> Path:
    name = (
        f"{spec.drafter_digest}-{target.info.fingerprint}-{str(dtype).removeprefix('torch.')}"
        f"-s{spec.stride}-k{spec.top_k}"
    )
    return Path(root) / "corrector" / name


def block_outputs(drafter: BlockDrafter, item: Item, top_k: int, chunk: int = 32) -> dict:
    """The cached fields of `item`'s blocks (one drafter pass, chunk by chunk)."""
    parts: dict[str, list[Tensor]] = {name: [] for name in FIELDS}
    for blocks in block_chunks(drafter, item, chunk):
        logits = drafter.logits(blocks.hidden, blocks.hint_ids).float()  # [n, slots, vocab]
        values, ids = logits.topk(top_k, dim=-1)
        hints = blocks.hint_ids
        parts["hidden"].append(blocks.hidden.to(torch.bfloat16))
        parts["hint_ids"].append(
            torch.full_like(blocks.label_ids, -1) if hints is None else hints[:, : ids.shape[1]]
        )
        parts["anchor_ids"].append(blocks.anchor_ids)
        parts["label_ids"].append(blocks.label_ids)
        parts["candidate_ids"].append(ids)
        parts["candidate_logits"].append(values)
        parts["label_logits"].append(logits.gather(-1, blocks.label_ids[..., None]).squeeze(-1))
        parts["logsumexp"].append(logits.logsumexp(dim=-1))
    joined = {name: torch.cat(values).cpu() for name, values in parts.items() if values}
    return {
        name: value.to(torch.int32) if value.dtype == torch.long else value
        for name, value in joined.items()
    }


def _shard(drafter, target, samples: list[Sample], anchors_of, top_k: int, bar) -> dict:
    """The fields of every block of `samples`, concatenated; target forwards in batches."""
    taps = tuple(drafter.config.target_layer_ids)
    rows: list[dict] = []
    with torch.inference_mode():
        for batch in length_batches(samples, 4096):
            width = max(s.num_tokens for s in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            for i, sample in enumerate(batch):
                ids[i, : sample.num_tokens] = torch.tensor(sample.input_ids)
            features = target.forward(
                ids.to(target.device), feature_layers=taps, with_logits=False
            ).features  # [batch, width, taps * hidden]
            for i, sample in enumerate(batch):
                anchors = anchors_of(sample)
                if anchors.numel():
                    item = Item(
                        ids=ids[i, : sample.num_tokens].to(target.device),
                        features=features[i : i + 1, : sample.num_tokens].to(drafter.dtype),
                        anchors=anchors.to(target.device),
                    )
                    rows.append(block_outputs(drafter, item, top_k))
            bar.update(sum(s.num_tokens for s in batch))
    if not rows:
        return {}
    return {name: torch.cat([r[name] for r in rows]) for name in FIELDS}


def _save(shard: dict, path: Path) -> None:
    staging = path.with_suffix(f".{os.getpid()}.partial")
    torch.save({"version": FORMAT_VERSION, **shard}, staging)
    os.replace(staging, path)


def load_shard(path: Path) -> dict | None:
    """A stored shard (memory-mapped), or None if it is missing or does not load whole."""
    if not path.is_file():
        return None
    try:
        shard = torch.load(path, mmap=True, weights_only=True)
        blocks = shard["anchor_ids"].shape[0] if "anchor_ids" in shard else 0
        ok = shard.get("version") == FORMAT_VERSION and all(
            shard[name].shape[0] == blocks for name in FIELDS if blocks
        )
    except (OSError, RuntimeError, KeyError, EOFError, ValueError):
        ok = False
    if not ok:
        print(
            f"dcoco: corrector shard {path.name} is corrupt or stale; rebuilding it",
            file=sys.stderr,
        )
        return None
    return shard


def heldout_anchor_rule(block_size: int):
    """`dcoco heldout`'s anchors: 64 random reply positions per record, one seed-0 generator
    advanced record by record in the split's order."""
    generator = torch.Generator().manual_seed(0)
    rule = AnchorRule(HELDOUT_ANCHORS)
    return lambda sample: rule.anchors(sample, block_size, 0, generator)


def build_corrector_cache(
    drafter: BlockDrafter,
    target,
    corpus: Path,
    root: Path,
    spec: CacheSpec,
    progress_bar: bool = True,
    build: bool = True,
) -> tuple[list[dict], dict]:
    """(training shards, the held-out shard): built where missing (with `build`; else only the
    held-out shard is), then all opened."""
    root.mkdir(parents=True, exist_ok=True)
    parts = corpus_parts(corpus)
    records = {part: read_part(part, target.max_context) for part in parts}
    everything = [s for samples in records.values() for s in samples]
    _, heldout = split_heldout(everything, spec.heldout_records)
    heldout_ids = {s.id for s in heldout}
    block = drafter.config.block_size
    train_rule = AnchorRule(0, spec.stride, 0)
    usable = [s for s in heldout if len(s.response_ids) >= block]
    key = hashlib.sha256("\n".join(s.id for s in usable).encode()).hexdigest()[:16]
    # The held-out shard first: a trainer evaluates on it while later shards are still built.
    jobs = [(root / f"heldout-{key}.pt", usable, heldout_anchor_rule(block))]
    jobs += [
        (
            root / f"{part.stem}-{part_key(part)}.pt",
            [s for s in samples if s.id not in heldout_ids and len(s.response_ids) >= block],
            lambda s: train_rule.anchors(s, block, 0, None),
        )
        for part, samples in records.items()
    ]
    shards = {path: load_shard(path) for path, _, _ in jobs}
    missing = [job for i, job in enumerate(jobs) if shards[job[0]] is None and (build or i == 0)]
    if missing:
        total = sum(s.num_tokens for _, samples, _ in missing for s in samples)
        print(
            f"dcoco: caching drafter outputs of {len(missing)} shards ({total:,} tokens) under "
            f"{root}",
            file=sys.stderr,
        )
        start = time.perf_counter()
        with tqdm(total=total, unit="tok", unit_scale=True, disable=not progress_bar) as bar:
            for path, samples, anchors_of in missing:
                _save(_shard(drafter, target, samples, anchors_of, spec.top_k, bar), path)
                shards[path] = load_shard(path)
                bar.write(f"dcoco: cached {path.name} ({len(samples)} records)")
        rate = total / max(time.perf_counter() - start, 1e-9)
        print(f"dcoco: corrector cache complete ({rate:,.0f} tokens/s)", file=sys.stderr)
    opened = [shards[path] for path, _, _ in jobs]
    return [s for s in opened[1:] if s is not None and "anchor_ids" in s], opened[0]


@dataclass
class CorrectorCacheConfig:
    drafter: str = "dflash"  # the frozen drafter: a checkpoint name or directory
    target: str = DEFAULT_TARGET  # embedded name or Hugging Face model directory
    corpus: str = ""  # part-*.jsonl dir; empty = the target's shared corpus
    dtype: str = "bf16"  # the target's and drafter's dtype while caching
    stride: int = 8  # every stride-th reply position of a training record is an anchor
    top_k: int = 32  # candidates stored per slot (a head may use fewer)
    heldout: int = 32  # held-out records (dcoco heldout's split), cached apart
    cache_dir: str = ""  # where the cache lives; empty = $DCOCO_CACHE_DIR
    threads: int = 0  # torch CPU threads; 0 = torch's default
    build: bool = True  # build missing shards (--no-build: open the shards built so far)


def drafter_path(drafter: str, target) -> Path:
    """The checkpoint directory of `drafter`: a path, or a name under checkpoints/<target>/."""
    return checkpoint_dir(MethodSpec("dflash", None, drafter), target, MethodOptions())


def open_cache(config: CorrectorCacheConfig, target=None, progress_bar: bool = True):
    """(training shards, held-out shard, cache dir) of `config`, built where missing."""
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    target = target or load_target(config.target, config.dtype)
    path = drafter_path(config.drafter, target)
    drafter = load_drafter(path, target)
    spec = CacheSpec(
        weights_digest(path / WEIGHTS_FILE), config.stride, config.top_k, config.heldout
    )
    root = cache_root(Path(config.cache_dir or cache_dir()), spec, target, target.dtype)
    corpus = Path(config.corpus or default_corpus(config.target))
    train, heldout = build_corrector_cache(
        drafter, target, corpus, root, spec, progress_bar, config.build
    )
    return train, heldout, root


def run(config: CorrectorCacheConfig) -> int:
    train, heldout, root = open_cache(config)
    blocks = sum(s["anchor_ids"].shape[0] for s in train)
    print(
        f"dcoco: corrector cache {portable(root)}: {blocks:,} training blocks in {len(train)} "
        f"shards, {heldout['anchor_ids'].shape[0]:,} held-out blocks",
        file=sys.stderr,
    )
    return 0


COMMAND = Command(
    "corrector-cache",
    "cache a frozen drafter's per-block outputs over the corpus (for drop-in head training)",
    CorrectorCacheConfig,
    run,
    description=__doc__.split("\n\n")[0],
)
