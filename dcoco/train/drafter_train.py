"""`dcoco train-drafter`: train a DFlash block drafter on the target's own replies.

Each step takes `batch_size` sequences, computes their target taps once (no grad), samples
`anchors_per_seq` full blocks per sequence and trains on the decayed, same-position cross-entropy
of the mask slots (dcoco/train/blocks.py holds the block rules). The drafter sees exactly the
inference math: one BlockDrafter.forward, here with a block-diagonal mask.

Sequences are run one at a time (no padding) with their gradients accumulated, so the loss is
Sum w*CE / Sum w over the whole batch. Batch order and anchors are derived from (seed, step), so a
run resumed from `<out>/ckpt/` continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from dcoco import REPO_ROOT
from dcoco.config import add_config_args, config_from_args
from dcoco.data.distill import Sample, load_corpus, split_heldout
from dcoco.errors import DcocoError
from dcoco.models.drafter import BlockDrafter, DrafterConfig, check_compatible
from dcoco.models.drafter_io import save_drafter
from dcoco.models.loading import DEFAULT_TARGET, load_target
from dcoco.train.blocks import (
    IGNORE,
    acceptance_stats,
    block_attention_mask,
    block_inputs_and_labels,
    sample_anchors,
    slot_weights,
)
from dcoco.train.run_dir import RunDir, provenance
from dcoco.train.target_features import TargetFeatures

# The shared corpus sits beside the checkout (resolved from the package, not the cwd).
DEFAULT_CORPUS = REPO_ROOT.parent / "shared" / "data" / "distill" / "smollm2-135m-instruct"


@dataclass
class DrafterTrainConfig:
    target: str = DEFAULT_TARGET
    corpus: str = str(DEFAULT_CORPUS)
    out: str = "runs/drafter"
    num_layers: int = 2
    block_size: int = 16
    mask_token_id: int = 16
    taps: tuple[int, ...] = ()
    gamma: float = 7.0
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.04
    grad_clip: float = 1.0
    epochs: int = 1
    max_steps: int = 0
    batch_size: int = 4
    anchors_per_seq: int = 32
    max_seq_len: int = 1024
    max_records: int = 0
    seed: int = 0
    target_dtype: str = "fp32"
    device: str = ""
    autocast: bool = False
    eval_every: int = 100
    heldout: int = 32
    save_every: int = 50
    threads: int = 0
    feature_cache: str = ""

    def __post_init__(self) -> None:
        positive = ["num_layers", "batch_size", "anchors_per_seq", "eval_every", "save_every"]
        bad = [name for name in positive if getattr(self, name) < 1]
        if bad or self.block_size < 2 or self.gamma <= 0 or self.lr <= 0:
            raise DcocoError(
                f"bad training settings: {', '.join(bad) or 'block size/gamma/lr'} out of range "
                "(counts must be >= 1, block size >= 2, gamma and lr > 0)"
            )


HELPS = {
    "target": "embedded target name or Hugging Face model directory",
    "corpus": "directory of part-*.jsonl distillation records",
    "out": "run directory (log, ckpt/ for resuming, drafter/ at the end)",
    "num_layers": "draft layers",
    "mask_token_id": "target vocab row used as the MASK input (an id the target never emits)",
    "taps": "target layers to tap, comma-separated; empty = DFlash's rule with 3 taps",
    "gamma": "slot loss decay: w_k = exp(-(k-1)/gamma)",
    "epochs": "passes over the training split (ignored when --max-steps > 0)",
    "max_steps": "stop after this many optimizer steps; 0 = run the epochs",
    "batch_size": "sequences per optimizer step",
    "anchors_per_seq": "blocks sampled per sequence per step",
    "max_seq_len": "cut sequences (prompt + response) to this many tokens",
    "max_records": "read at most this many corpus records; 0 = all",
    "target_dtype": "frozen target dtype (fp32, bf16, fp16); CPUs without AVX512-BF16/AMX run bf16 "
    "matmuls 50-100x slower than fp32",
    "device": "cpu or cuda; empty = cuda when available",
    "autocast": "bf16 autocast for the drafter (fp32 master weights); a win only where bf16 "
    "matmuls are fast (GPU, AMX)",
    "eval_every": "steps between held-out evaluations",
    "heldout": "held-out sequences (chosen by hash of id) for the acceptance estimate",
    "save_every": "steps between resumable checkpoints",
    "threads": "torch CPU threads; 0 = torch's default",
    "feature_cache": "directory to keep target features in (bf16); empty = recompute",
}


@dataclass
class _Progress:
    step: int = 0
    tokens: int = 0


@dataclass
class _Item:
    """One sequence ready for the drafter."""

    ids: Tensor  # [tokens] int64
    features: Tensor  # [1, tokens, taps * hidden]
    anchors: Tensor  # [n] int64


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-drafter",
        help="train a DFlash block drafter for a target",
        description="Train a DFlash block drafter on the target's own replies. Writes "
        "<out>/train_log.jsonl, a resumable <out>/ckpt/ (rerun with the same --out to continue) "
        "and finally <out>/drafter/ (config.json, model.safetensors, provenance.json).",
    )
    add_config_args(parser, DrafterTrainConfig, HELPS)
    parser.set_defaults(handler=run)


def run(args) -> int:
    result = train(config_from_args(DrafterTrainConfig, args))
    summary = f"dcoco: drafter -> {result['drafter']} after {result['steps']} steps"
    if result["final"]:
        summary += f"; held-out acceptance length {result['final']['accept']:.2f}"
    print(summary, file=sys.stderr)
    return 0


def train(
    config: DrafterTrainConfig,
    target=None,
    samples: list[Sample] | None = None,
    progress_bar: bool = True,
) -> dict:
    """Train (or resume) a drafter as `config` says; returns the held-out metrics and paths.

    `target` (a TargetModel) and `samples` replace loading `config.target` and `config.corpus`.
    """
    started = datetime.now(UTC).isoformat()
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    if target is None:
        target = load_target(config.target, config.target_dtype, config.device or None)
    if samples is None:
        samples = load_corpus(config.corpus, config.max_records or None, config.max_seq_len)
    # A response shorter than a block has no full block to train on.
    samples = [s for s in samples if len(s.response_ids) >= config.block_size]
    train_set, heldout = split_heldout(samples, config.heldout)
    if not train_set:
        raise DcocoError(f"no training record has a response of >= {config.block_size} tokens")
    drafter_config = DrafterConfig.for_target(
        target, config.num_layers, config.block_size, config.mask_token_id, config.taps or None
    )
    check_compatible(drafter_config, target.info)
    torch.manual_seed(config.seed)
    # fp32 master weights; autocast runs the math in bf16.
    drafter = BlockDrafter(drafter_config, target.embed_tokens, target.lm_head).to(target.device)
    total_steps = config.max_steps or config.epochs * math.ceil(len(train_set) / config.batch_size)
    optimizer = torch.optim.AdamW(
        drafter.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    warmup = max(1, math.ceil(config.warmup_ratio * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _warmup_cosine(step, warmup, total_steps)
    )
    run_dir = RunDir(config.out)
    progress = _resume(run_dir, drafter, optimizer, scheduler)
    features = TargetFeatures(target, drafter_config.target_layer_ids, config.feature_cache)
    weights = slot_weights(config.block_size, config.gamma).to(target.device)
    autocast = torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=config.autocast)
    eval_generator = torch.Generator().manual_seed(config.seed)
    eval_items = [_prepare(s, features, config, eval_generator) for s in heldout]

    def evaluate(step: int) -> dict | None:
        if not eval_items:
            return None
        metrics = _evaluate(drafter, eval_items, weights, autocast)
        run_dir.log({"event": "eval", "step": step, **metrics})
        return metrics

    run_dir.log(
        {
            "event": "resume" if progress.step else "start",
            "step": progress.step,
            "total_steps": total_steps,
            "train_records": len(train_set),
            "heldout_records": len(eval_items),
        }
    )
    initial = evaluate(0) if progress.step == 0 else None
    bar = tqdm(total=total_steps, initial=progress.step, unit="step", disable=not progress_bar)
    while progress.step < total_steps:
        tick = time.perf_counter()
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + progress.step)
        batch = _batch_at(train_set, progress.step, config.batch_size, config.seed)
        items = [_prepare(s, features, config, generator) for s in batch]
        loss, accept = _train_step(drafter, items, weights, autocast, config.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step += 1
        progress.tokens += sum(s.num_tokens for s in batch)
        run_dir.log(
            {
                "event": "train",
                "step": progress.step,
                "loss": loss,
                "accept": accept,
                "lr": scheduler.get_last_lr()[0],
                "tokens": progress.tokens,
                "step_s": time.perf_counter() - tick,
            }
        )
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tau=f"{accept:.2f}")
        if progress.step % config.eval_every == 0 and progress.step < total_steps:
            metrics = evaluate(progress.step)
            if metrics:
                bar.write(f"step {progress.step}: held-out tau {metrics['accept']:.3f}")
        if progress.step % config.save_every == 0 or progress.step == total_steps:
            run_dir.save_checkpoint(
                {
                    "model": drafter.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "step": progress.step,
                    "tokens": progress.tokens,
                    "rng": torch.get_rng_state(),
                    "drafter": dataclasses.asdict(drafter_config),
                }
            )
    bar.close()

    final = evaluate(progress.step)
    drafter_dir = Path(config.out) / "drafter"
    save_drafter(
        drafter_dir,
        drafter,
        target.info,
        extra={"training": {"steps": progress.step, "heldout": final}},
    )
    record = provenance(
        config=dataclasses.asdict(config),
        run_dir=str(Path(config.out).resolve()),
        drafter_config=dataclasses.asdict(drafter_config),
        target=dataclasses.asdict(target.info),
        started=started,
        finished=datetime.now(UTC).isoformat(),
        steps=progress.step,
        tokens_seen=progress.tokens,
        train_records=len(train_set),
        initial_heldout=initial,
        final_heldout=final,
    )
    (drafter_dir / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")
    run_dir.log({"event": "done", "step": progress.step})
    run_dir.close()
    return {
        "initial": initial,
        "final": final,
        "steps": progress.step,
        "tokens": progress.tokens,
        "drafter": str(drafter_dir),
    }


def _warmup_cosine(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def _batch_at(samples: list[Sample], step: int, batch_size: int, seed: int) -> list[Sample]:
    """The sequences of `step`: a fresh permutation of the training split each epoch."""
    per_epoch = math.ceil(len(samples) / batch_size)
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed + epoch))
    return [samples[i] for i in order[index * batch_size : (index + 1) * batch_size].tolist()]


def _prepare(
    sample: Sample, features: TargetFeatures, config: DrafterTrainConfig, generator: torch.Generator
) -> _Item:
    ids = torch.tensor(sample.input_ids, device=features.target.device)
    loss_mask = torch.zeros(sample.num_tokens, dtype=torch.bool, device=ids.device)
    loss_mask[len(sample.prompt_ids) :] = True
    anchors = sample_anchors(loss_mask, config.anchors_per_seq, config.block_size, generator)
    return _Item(ids=ids, features=features(sample), anchors=anchors)


def _train_step(
    drafter: BlockDrafter, items: list[_Item], weights: Tensor, autocast, grad_clip: float
) -> tuple[float, float]:
    """Accumulate the batch's gradients (one sequence at a time) and clip them.

    Returns the batch loss Sum w*CE / Sum w and the simulated acceptance length on its blocks.
    """
    drafter.train()
    # Every block is full, so the batch's total weight is known before any forward.
    weight_total = sum(item.anchors.numel() for item in items) * weights.sum().item()
    loss, corrects = 0.0, []
    for item in items:
        with autocast:
            weighted_ce, _, correct = _block_losses(drafter, item, weights)
        (weighted_ce / weight_total).backward()
        loss += weighted_ce.item()
        corrects.append(correct)
    torch.nn.utils.clip_grad_norm_(drafter.parameters(), grad_clip)
    _, accepted = acceptance_stats(torch.cat(corrects))
    return loss / weight_total, accepted.mean().item()


def _block_losses(drafter: BlockDrafter, item: _Item, weights: Tensor):
    """(Sum w*CE, Sum w, correct [blocks, slots]) of one sequence's blocks."""
    block_size = drafter.config.block_size
    ids, anchors = item.ids[None], item.anchors[None]  # [1, tokens], [1, n]
    block_ids, positions, labels = block_inputs_and_labels(
        ids, anchors, block_size, drafter.config.mask_token_id
    )
    mask = block_attention_mask(anchors, ids.shape[1], block_size)
    context_positions = torch.arange(ids.shape[1], device=ids.device)[None]
    hidden = drafter(drafter.embed(block_ids), item.features, context_positions, positions, mask)
    labelled = labels[0] != IGNORE  # full blocks: every slot but the anchor
    # The 49k-row head is the costliest op here: run it on the labelled slots only.
    logits = drafter.logits(hidden[0, labelled]).float()  # [blocks * slots, vocab]
    targets = labels[0, labelled]
    slot_weight = weights[torch.arange(labels.shape[1], device=ids.device) % block_size][labelled]
    ce = F.cross_entropy(logits, targets, reduction="none")
    correct = (logits.argmax(dim=-1) == targets).view(-1, block_size - 1)
    return (slot_weight * ce).sum(), slot_weight.sum(), correct


@torch.no_grad()
def _evaluate(drafter: BlockDrafter, items: list[_Item], weights: Tensor, autocast) -> dict:
    """Held-out weighted loss, per-slot accuracy and simulated acceptance length (with bonus)."""
    drafter.eval()
    loss, weight, corrects = 0.0, 0.0, []
    for item in items:
        with autocast:
            weighted_ce, weight_sum, correct = _block_losses(drafter, item, weights)
        loss += weighted_ce.item()
        weight += weight_sum.item()
        corrects.append(correct)
    slot_acc, accepted = acceptance_stats(torch.cat(corrects))
    return {
        "loss": loss / weight,
        "accept": accepted.mean().item(),
        "slot_acc": [round(a, 4) for a in slot_acc.tolist()],
        "blocks": accepted.numel(),
    }


def _resume(run_dir: RunDir, drafter, optimizer, scheduler) -> _Progress:
    """Load `<out>/ckpt/` into the fresh objects, if a checkpoint is there."""
    state = run_dir.load_checkpoint(drafter.fc.weight.device)
    if state is None:
        return _Progress()
    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in state["drafter"].items()}
    if stored != dataclasses.asdict(drafter.config):
        raise DcocoError(
            f"{run_dir.path} holds a checkpoint of another drafter ({stored}); use another --out "
            "or delete its ckpt/"
        )
    drafter.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return _Progress(step=state["step"], tokens=state["tokens"])


if __name__ == "__main__":
    from dcoco.cli import main

    sys.exit(main(["train-drafter", *sys.argv[1:]]))
