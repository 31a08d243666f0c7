"""`dcoco coverage`: how often the drafter's top-K lists hold the token the target commits.

This is the headroom a corrector can use: where the drafter's top-1 is wrong but the target's
token is among its top-K candidates, re-selecting among them (DCOCO) can still get it accepted.

For every response position of every sequence (the target's own greedy replies: the held-out
split of the distillation corpus, or replies generated here to bench prompts) the drafter drafts
the block after it, teacher-forced exactly as in training, and each slot's top-K list is compared
with the token the target committed there. Per slot: top-1 accuracy, top-k coverage for k = 1..K,
and coverage among the slots where top-1 is wrong. Writes JSON and a PNG.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dcoco.config import Command
from dcoco.data.distill import Sample, load_corpus, split_heldout
from dcoco.decode.methods import default_drafter_dir
from dcoco.errors import DcocoError
from dcoco.eval.run_record import write_run_record
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.target.loading import DEFAULT_TARGET, load_target
from dcoco.paths import default_corpus, portable_record
from dcoco.train.block_pass import AnchorRule, block_chunks, prepare_item
from dcoco.train.target_features import TargetFeatures

JSON_FILE = "coverage.json"
PLOT_FILE = "coverage.png"


@dataclass
class CoverageConfig:
    target: str = DEFAULT_TARGET  # embedded name or Hugging Face model directory
    drafter: str = ""  # drafter checkpoint; empty = the one shipped for the target
    source: str = "corpus"  # corpus: held-out corpus replies; suites: generate replies here
    corpus: str = ""  # corpus source: part-*.jsonl dir; empty = the target's shared corpus
    records: int = 32  # held-out records (corpus) or prompts (suites)
    data_dir: str = ""  # suites source: bench data dir; empty = ../shared/data when present
    suites: str = "gsm8k,humaneval,mtbench"  # suites source: all | comma-separated suite names
    max_new_tokens: int = 256  # suites source: reply length
    anchors_per_seq: int = 64  # blocks per sequence (0 = every response position)
    top_k: int = 16  # K: the longest candidate list measured
    dtype: str = "fp32"  # the target's dtype (fp32, bf16, fp16)
    threads: int = 0  # torch CPU threads; 0 = torch's default
    feature_cache: str = ""  # directory of cached target features (as in training); empty = none
    out: str = "results/coverage"  # output dir: coverage.json, coverage.png

    def __post_init__(self) -> None:
        if self.source not in ("corpus", "suites"):
            raise DcocoError(f"unknown source '{self.source}': choose corpus or suites")
        if self.top_k < 1 or self.records < 1:
            raise DcocoError("top-k and records must be >= 1")


def run(config: CoverageConfig) -> int:
    if config.source == "corpus":
        config.corpus = config.corpus or str(default_corpus(config.target))
    result = measure(config)
    out = write(result, Path(config.out))
    write_run_record(Path(config.out), "coverage", config)
    slots = result["per_slot"]
    print(f"slot  top1   top{config.top_k}   top{config.top_k}|top1 wrong")
    for slot, row in enumerate(slots, start=1):
        print(
            f"{slot:>4}  {row['top1']:.3f}  {row['coverage'][-1]:.3f}  "
            f"{row['coverage_when_top1_wrong'][-1]:.3f}"
        )
    print(f"coverage: {out}", file=sys.stderr)
    return 0


def measure(config: CoverageConfig, target=None, samples: list[Sample] | None = None) -> dict:
    """Per-slot coverage of the drafter on `samples` (default: from `config.source`)."""
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    target = target or load_target(config.target, config.dtype)
    path = Path(config.drafter) if config.drafter else default_drafter_dir(target)
    drafter = load_drafter(path, target)
    if config.top_k > drafter.config.vocab_size:
        raise DcocoError(f"top-k {config.top_k} exceeds the vocab size")
    if samples is None:
        samples = _samples(config, target)
    block_size = drafter.config.block_size
    samples = [s for s in samples if len(s.response_ids) >= block_size]
    if not samples:
        raise DcocoError(f"no reply has the {block_size} tokens a full block needs")
    features = TargetFeatures(target, drafter.config.target_layer_ids, config.feature_cache)
    slots, top_k = block_size - 1, config.top_k
    hits = torch.zeros(slots, top_k)  # [slots, K]: label within top-k, counted
    hits_when_wrong = torch.zeros(slots, top_k)
    wrong = torch.zeros(slots)
    blocks = 0
    generator = torch.Generator().manual_seed(0)
    anchors = config.anchors_per_seq or 1 << 30
    with torch.no_grad():
        for sample in tqdm(samples, unit="seq", file=sys.stderr):
            item = prepare_item(
                sample, features, AnchorRule(anchors), block_size, generator, 0, target.device
            )
            for chunk in block_chunks(drafter, item, 32):
                logits = drafter.logits(chunk.hidden, chunk.hint_ids).float()
                ranked = logits.topk(top_k, dim=-1).indices
                found = (ranked == chunk.label_ids[..., None]).cumsum(-1) > 0  # [blocks, slots, K]
                top1_wrong = ~found[..., 0]  # [blocks, slots]
                hits += found.sum(0).cpu()
                hits_when_wrong += (found & top1_wrong[..., None]).sum(0).cpu()
                wrong += top1_wrong.sum(0).cpu()
                blocks += found.shape[0]
    coverage = hits / blocks
    when_wrong = hits_when_wrong / wrong.clamp(min=1)[:, None]
    return {
        "config": asdict(config),
        "drafter": str(path),
        "sequences": len(samples),
        "blocks": blocks,
        "per_slot": [
            {
                "top1": round(coverage[s, 0].item(), 4),
                "coverage": [round(v, 4) for v in coverage[s].tolist()],
                "coverage_when_top1_wrong": [round(v, 4) for v in when_wrong[s].tolist()],
            }
            for s in range(slots)
        ],
    }


def _samples(config: CoverageConfig, target) -> list[Sample]:
    if config.source == "corpus":
        corpus = config.corpus or default_corpus(config.target)
        _, heldout = split_heldout(load_corpus(corpus), config.records)
        return heldout
    from dcoco.decode.engine import Engine
    from dcoco.eval.suites import load_prompts

    prompts = load_prompts(config.data_dir, "", config.suites, config.records)
    engine = Engine(target)
    samples = []
    for prompt in tqdm(prompts, unit="reply", file=sys.stderr, desc="target replies"):
        prompt_ids = target.encode_chat(prompt.turns[0])
        reply = engine.generate(prompt_ids, config.max_new_tokens)
        name = f"{prompt.suite}/{prompt.id}"
        samples.append(Sample(name, tuple(prompt_ids), tuple(reply.new_ids)))
    return samples


def write(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_FILE).write_text(json.dumps(portable_record(result), indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["per_slot"]
    slots = list(range(1, len(rows) + 1))
    top_k = len(rows[0]["coverage"])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k in sorted({1, 2, 4, 8, top_k} & set(range(1, top_k + 1))):
        ax.plot(slots, [r["coverage"][k - 1] for r in rows], marker="o", label=f"top-{k}")
    ax.plot(
        slots,
        [r["coverage_when_top1_wrong"][-1] for r in rows],
        linestyle="--",
        color="black",
        label=f"top-{top_k} where top-1 is wrong",
    )
    ax.set_xlabel("draft slot")
    ax.set_ylabel("share of blocks holding the target's token")
    ax.set_ylim(0, 1)
    ax.set_title(f"drafter top-k coverage ({result['blocks']} blocks)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOT_FILE, dpi=120)
    plt.close(fig)
    return out


COMMAND = Command(
    "coverage",
    "per-slot top-1 accuracy and top-k coverage of a drafter (corrector headroom)",
    CoverageConfig,
    run,
    description=__doc__.split("\n\n")[1],
)
