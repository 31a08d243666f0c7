"""`dcoco heldout`: every drafter method's acceptance on the same held-out blocks, without decoding.

For greedy decoding the acceptance length of a deterministic draft is its longest prefix that
equals the target's own continuation, plus the bonus token. The distillation corpus holds the
target's greedy replies, so drafting the block after each held-out reply position (teacher-forced
context, exactly the context the engine would have there) and comparing it with the reply gives
the engine's acceptance length at that anchor, for any selection rule, with no target verify
forward. Every method sees the same blocks (same sequences, same anchors), so the table compares
drafters, heads and selection rules like with like, on thousands of blocks in minutes.

The `slots` caps give τ when a cycle drafts only the first c slots (as `--num-draft-tokens c`).
`--bench-run DIR` measures on the prompts of a `dcoco bench` run instead (plain's T=0 replies,
see eval/bench_corpus.py), with a row per suite as well.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from dcoco.config import Command
from dcoco.data.bigram import CountBigram
from dcoco.data.distill import load_corpus, split_heldout
from dcoco.decode.methods import (
    MethodOptions,
    build_proposer,
    check_method,
    checkpoint_dir,
    parse_method,
)
from dcoco.errors import DcocoError
from dcoco.eval.heldout_lookup import lookup_corrects
from dcoco.eval.heldout_table import markdown_table, oracle_corrects, oracle_names
from dcoco.eval.run_record import method_checkpoints, write_run_record
from dcoco.models.drafter.copy_hints import NO_HINT
from dcoco.models.drafter.drafter_io import WEIGHTS_FILE
from dcoco.models.heads.base import select_draft
from dcoco.models.target.loading import DEFAULT_TARGET, load_target
from dcoco.paths import default_corpus, portable, portable_record
from dcoco.train.block_pass import AnchorRule, block_chunks, copy_hints_of, prepare_item
from dcoco.train.target_features import TargetFeatures

JSON_FILE = "heldout.json"
# The row of the count baseline (dcoco.data.bigram): x_t -> x_{t+k} from the anchor token alone.
BIGRAM = "count bigram"
TABLE_FILE = "heldout.md"


@dataclass
class HeldoutConfig:
    methods: tuple[str, ...] = ("dflash", "dcoco")  # drafter specs, METHOD[:SELECTION][@CHECKPOINT]
    target: str = DEFAULT_TARGET  # embedded name or Hugging Face model directory
    corpus: str = ""  # part-*.jsonl dir; empty = the target's shared corpus
    records: int = 32  # held-out records (the split training holds out, by id hash)
    anchors_per_seq: int = 64  # 0 = every response position
    num_draft_tokens: tuple[int, ...] = (3, 15)  # τ when a cycle drafts only the first c slots
    dtype: str = "fp32"  # the target's dtype (fp32, bf16, fp16)
    threads: int = 0  # torch CPU threads; 0 = torch's default
    feature_cache: str = ""  # directory of cached target features (as in training)
    bench_run: str = ""  # a `dcoco bench` run dir: its plain T=0 replies replace the corpus
    oracle_k: int = 16  # > 0: top-k oracle rows over the first drafter, and headroom shares
    out: str = "results/heldout"  # output dir: heldout.json, heldout.md


def run(config: HeldoutConfig) -> int:
    config.corpus = config.corpus or str(default_corpus(config.target))
    out = Path(config.out)
    result = measure(config, done=_earlier_rows(out / JSON_FILE, config))
    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_FILE).write_text(json.dumps(portable_record(result), indent=2) + "\n")
    table = markdown_table(result)
    (out / TABLE_FILE).write_text(table + "\n")
    write_run_record(out, "heldout", config, method_checkpoints(config.methods, config.target))
    print(table)
    print(f"held-out acceptance: {out}", file=sys.stderr)
    return 0


def _earlier_rows(path: Path, config: HeldoutConfig) -> dict:
    """Rows of an earlier run in the same output dir with the same settings (methods aside), so
    adding a method to the table measures only that method."""
    if not path.is_file():
        return {}
    earlier = json.loads(path.read_text())
    settings = {k: v for k, v in portable_record(asdict(config)).items() if k != "methods"}
    stored = {k: v for k, v in portable_record(earlier.get("config", {})).items() if k != "methods"}
    return earlier.get("methods", {}) if stored == settings else {}


def measure(
    config: HeldoutConfig, target=None, samples=None, done: dict | None = None, bigram_split=None
) -> dict:
    """Rows for every method of `config`; those in `done` (method -> row) are reused. The count
    bigram's row is counted on `bigram_split`, by default (records read here) the corpus less
    its held-out split; records passed in get it only with a `bigram_split`."""
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    methods = [check_method(m) for m in config.methods if m.strip()]
    if not methods:
        raise DcocoError("--methods is empty")
    target = target or load_target(config.target, config.dtype)
    if samples is None:
        train, heldout = _corpus_split(config, target.info.vocab_size)
        bigram_split = bigram_split if bigram_split is not None else train
        if config.bench_run:
            from dcoco.eval.bench_corpus import bench_samples

            samples = bench_samples(config.bench_run, target)
        elif heldout is None:
            raise DcocoError(
                f"{config.corpus or default_corpus(config.target)} is no corpus of this target"
            )
        else:
            samples = heldout
    rows, oracle = {}, None
    if done and BIGRAM in done:
        bigram_split = None
    for method in methods:
        weights = _weights_digest(method, target)
        label = _label(method)
        base = oracle is None and config.oracle_k > 0 and parse_method(method).method != "pld"
        if base:
            oracle = {"k": config.oracle_k, "base": label}
        names = oracle_names(config.oracle_k, label) if base else ()
        reusable = [label, *names]
        if done and all(done.get(n, {}).get("weights") == weights for n in reusable):
            rows.update({n: done[n] for n in reusable})
            continue
        if parse_method(method).method == "pld":  # no drafter: the block size of the slot caps
            block = max(config.num_draft_tokens) + 1
            corrects = lookup_corrects(
                samples, block, config.anchors_per_seq or 1 << 30, bool(config.bench_run)
            )
            rows[label] = {**_row(corrects, config), "weights": weights}
            continue
        proposer = build_proposer(method, target, MethodOptions())
        if proposer is None or not hasattr(proposer, "drafter"):
            raise DcocoError(f"'{method}' is not a drafter method")
        bigram = None
        if bigram_split is not None:  # counted once, on the first measured drafter's blocks
            slots = proposer.drafter.config.block_size - 1
            bigram = CountBigram(bigram_split, slots, proposer.drafter.config.vocab_size)
            bigram_split = None
        found = _accept(proposer, target, samples, config, bigram, names)
        rows[label] = found.pop("")
        rows.update({n: found.pop(n) for n in names})
        for name in reusable:
            rows[name]["weights"] = weights
        rows.update(found)  # the count bigram's row, if counted here
    if done and BIGRAM in done:
        rows[BIGRAM] = done[BIGRAM]
    record = {**asdict(config), "methods": [_label(m) for m in methods]}
    result = {"config": record, "sequences": len(samples), "methods": rows}
    return {**result, "oracle": oracle} if oracle else result


def _label(method: str) -> str:
    """The row name: the spec, with a checkpoint path under the cache or the checkout written
    portably (`dflash@$DCOCO_CACHE_DIR/runs/x/snapshot`), so results name no machine's paths."""
    checkpoint = parse_method(method).checkpoint
    if not checkpoint or not Path(checkpoint).expanduser().is_absolute():
        return method
    return method.replace(checkpoint, portable(Path(checkpoint).expanduser()))


def _weights_digest(method: str, target) -> str:
    """A digest of the method's checkpoint weights: an earlier row is reused only for the same
    weights, so a checkpoint retrained under the same name is measured again."""
    path = checkpoint_dir(parse_method(method), target, MethodOptions()) / WEIGHTS_FILE
    if not path.is_file():
        return ""  # build_proposer says what is missing
    digest = hashlib.sha256()
    with path.open("rb") as weights:
        for chunk in iter(lambda: weights.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def _corpus_split(config: HeldoutConfig, vocab_size: int) -> tuple[list | None, list | None]:
    """(the records the bigram may count, the held-out split) of the target's corpus, read once;
    (None, None), said on stderr, when there is no corpus of this target (no bigram row)."""
    corpus = Path(config.corpus or default_corpus(config.target))
    try:
        records = load_corpus(corpus)
    except DcocoError:  # no such directory, or no part files in it
        records = []
    if not records or max(max(r.response_ids, default=0) for r in records) >= vocab_size:
        print(f"dcoco: no count-bigram row: {corpus} is no corpus of this target", file=sys.stderr)
        return None, None
    return split_heldout(records, config.records)


def _accept(proposer, target, samples, config: HeldoutConfig, bigram=None, oracles=()):
    """Rows on the held-out blocks: "" the method's acceptance; with a `bigram`, the count
    baseline's on the very same blocks; with `oracles` (their two row names), the top-k oracles
    over the drafter's own logits (dcoco.eval.heldout_table), k = `config.oracle_k`."""
    drafter, head = proposer.drafter, getattr(proposer, "head", None)
    block_size = drafter.config.block_size
    features = TargetFeatures(target, drafter.config.target_layer_ids, config.feature_cache)
    generator = torch.Generator().manual_seed(0)  # the same anchors for every method
    anchors = config.anchors_per_seq or 1 << 30  # 0: every response position
    # row name -> suite ("" for corpus records) -> [[blocks, slots]]
    corrects: dict[str, dict[str, list[Tensor]]] = {"": {}}
    with torch.no_grad():
        for sample in tqdm(samples, unit="seq", file=sys.stderr, desc=proposer.name):
            if len(sample.response_ids) < block_size:
                continue
            suite = sample.id.split("/")[0] if config.bench_run else ""
            item = prepare_item(
                sample, features, AnchorRule(anchors), block_size, generator, 0, target.device
            )
            # pld-dflash: prompt lookup's tokens wherever the context has a match
            lookup = copy_hints_of(item, block_size) if getattr(proposer, "lookup", False) else None
            done = 0
            for chunk in block_chunks(drafter, item, 32):
                # [blocks, slots, vocab]
                logits = drafter.logits(chunk.hidden, chunk.hint_ids).float()
                drafted = (
                    logits.argmax(dim=-1)
                    if head is None
                    else select_draft(
                        head, chunk.hidden, logits, chunk.anchor_ids, proposer.selection
                    )
                )
                if lookup is not None:
                    found = lookup[done : done + drafted.shape[0]]  # [blocks, slots]
                    drafted = torch.where(found[:, :1] != NO_HINT, found, drafted)
                    done += drafted.shape[0]
                found = {"": drafted == chunk.label_ids}
                if bigram is not None:
                    found[BIGRAM] = bigram.predict(chunk.anchor_ids) == chunk.label_ids
                if oracles:
                    found.update(
                        zip(
                            oracles,
                            oracle_corrects(logits, chunk.label_ids, config.oracle_k),
                            strict=True,
                        )
                    )
                for name, correct in found.items():
                    corrects.setdefault(name, {}).setdefault(suite, []).append(correct.cpu())
    if not corrects[""]:
        raise DcocoError(f"no reply is as long as a block ({block_size} tokens)")
    return {name: _row(parts, config) for name, parts in corrects.items()}


def _row(corrects: dict[str, list[Tensor]], config: HeldoutConfig) -> dict:
    row = _summary(
        torch.cat([c for parts in corrects.values() for c in parts]), config.num_draft_tokens
    )
    if config.bench_run:
        row["suites"] = {
            suite: _summary(torch.cat(parts), config.num_draft_tokens)
            for suite, parts in corrects.items()
        }
    return row


def _summary(correct: Tensor, slots: tuple[int, ...]) -> dict:
    """τ per slot cap, per-slot conditional acceptance and per-slot accuracy (unconditional: the
    issue-16 comparison with the count bigram) of `correct` [blocks, slots]."""
    prefix = correct.long().cumprod(dim=1)  # [blocks, slots]: slot reached and accepted
    reached = torch.cat([torch.ones_like(prefix[:, :1]), prefix[:, :-1]], dim=1)
    conditional = prefix.sum(0).float() / reached.sum(0).clamp(min=1)
    taus = {str(c): round((prefix[:, :c].sum(1) + 1).float().mean().item(), 4) for c in slots}
    return {
        "blocks": correct.shape[0],
        "tau": taus,
        "per_position": [round(v, 4) for v in conditional.tolist()],
        "slot_acc": [round(v, 4) for v in correct.float().mean(0).tolist()],
    }


COMMAND = Command(
    "heldout",
    "acceptance of drafter methods on the same held-out blocks, without decoding",
    HeldoutConfig,
    run,
    description=__doc__.split("\n\n")[1],
    renamed={"slots": "num_draft_tokens"},
)
