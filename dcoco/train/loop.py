"""The training loop shared by `dcoco train-drafter` and `dcoco train-corrector`.

Each step takes `batch_size` sequences, computes their target taps once (no grad), samples
`anchors_per_seq` full blocks per sequence and runs them through the drafter (dcoco.train.
block_pass). Without a head the loss is the drafter's; with one it is the head's, plus the
drafter's when the drafter trains too (joint), or the head's alone over a frozen drafter (drop-in).

Losses are Sum w*loss / Sum w over the whole batch, with gradients accumulated chunk by chunk.
Batch order and anchors derive from (seed, step), so a run resumed from `<out>/ckpt/` continues
exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from tqdm import tqdm

from dcoco.data.distill import Sample, load_corpus, split_heldout
from dcoco.errors import DcocoError
from dcoco.models.drafter import BlockDrafter, DrafterConfig, check_compatible
from dcoco.models.drafter_io import load_drafter, save_drafter
from dcoco.models.head_io import save_with_head
from dcoco.models.loading import load_target
from dcoco.train.block_pass import LossVocab, block_chunks, chunk_losses, prepare_item
from dcoco.train.blocks import acceptance_stats, slot_weights
from dcoco.train.run_dir import RunDir, provenance
from dcoco.train.target_features import TargetFeatures


@dataclass
class HeadSetup:
    """What a head run adds: how to build the head, and whether the drafter trains too."""

    build: Callable[[BlockDrafter], torch.nn.Module]  # drafter -> fresh head (zero output)
    train_drafter: bool  # True: joint; False: drop-in over a frozen drafter
    loss_weight: float = 1.0  # the head's loss relative to the drafter's (joint only)


@dataclass
class _Progress:
    step: int = 0
    tokens: int = 0


def run_training(config, target, samples, progress_bar: bool, head_setup: HeadSetup | None):
    started = datetime.now(UTC).isoformat()
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    if target is None:
        target = load_target(config.target, config.target_dtype, config.device or None)
    if samples is None:
        samples = load_corpus(config.corpus, config.max_records or None, config.max_seq_len)
    drafter = _initial_drafter(config, target)
    block_size = drafter.config.block_size
    # A response shorter than a block has no full block to train on.
    samples = [s for s in samples if len(s.response_ids) >= block_size]
    train_set, heldout = split_heldout(samples, config.heldout)
    if not train_set:
        raise DcocoError(f"no training record has a response of >= {block_size} tokens")
    torch.manual_seed(config.seed)
    head = head_setup.build(drafter).to(target.device) if head_setup else None
    train_drafter = head_setup is None or head_setup.train_drafter
    drafter.requires_grad_(train_drafter)
    trained = [
        *(drafter.parameters() if train_drafter else []),
        *(head.parameters() if head else []),
    ]
    total_steps = config.max_steps or config.epochs * math.ceil(len(train_set) / config.batch_size)
    optimizer = torch.optim.AdamW(trained, lr=config.lr, weight_decay=config.weight_decay)
    warmup = max(1, math.ceil(config.warmup_ratio * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _warmup_cosine(step, warmup, total_steps)
    )
    run_dir = RunDir(config.out)
    progress = _resume(run_dir, drafter, head, optimizer, scheduler)
    features = TargetFeatures(target, drafter.config.target_layer_ids, config.feature_cache)
    weights = slot_weights(block_size, config.gamma)[1:].to(target.device)  # [slots]
    loss_vocab = LossVocab.most_frequent(drafter, train_set, config.loss_vocab)
    full_vocab = LossVocab(drafter, None)
    eval_generator = torch.Generator().manual_seed(config.seed)
    eval_items = [
        prepare_item(s, features, config.anchors_per_seq, block_size, eval_generator)
        for s in heldout
    ]
    head_weight = head_setup.loss_weight if head_setup and train_drafter else 1.0

    def step_losses(items, vocab, progress_fraction: float, backward: bool) -> dict:
        blocks = sum(item.anchors.numel() for item in items)
        weight_total = blocks * weights.sum().item()  # every block is full
        totals = {"drafter": 0.0, "head": 0.0}
        drafter_correct, head_correct = [], []
        for item in items:
            for chunk in block_chunks(drafter, item, config.anchor_chunk):
                out = chunk_losses(
                    drafter, head, chunk, vocab, weights, progress_fraction, train_drafter
                )
                loss = out.drafter_loss if train_drafter else out.drafter_loss.detach()
                if head is not None:
                    loss = (loss if train_drafter else 0) + head_weight * out.head_loss
                    totals["head"] += out.head_loss.item()
                    head_correct.append(out.head_correct)
                if backward:
                    (loss / weight_total).backward()
                totals["drafter"] += out.drafter_loss.item()
                drafter_correct.append(out.drafter_correct)
        slot_acc, accepted = acceptance_stats(torch.cat(drafter_correct))
        metrics = {
            "loss": totals["drafter"] / weight_total,
            "accept": accepted.mean().item(),
            "slot_acc": [round(a, 4) for a in slot_acc.tolist()],
            "blocks": blocks,
        }
        if head is not None:
            head_acc, head_accepted = acceptance_stats(torch.cat(head_correct))
            metrics.update(
                drafter_loss=metrics["loss"],
                drafter_accept=metrics["accept"],
                loss=totals["head"] / weight_total,
                accept=head_accepted.mean().item(),
                slot_acc=[round(a, 4) for a in head_acc.tolist()],
            )
        return metrics

    def evaluate(step: int) -> dict | None:
        if not eval_items:
            return None
        drafter.eval()
        if head is not None:
            head.eval()
        with torch.no_grad():
            metrics = step_losses(eval_items, full_vocab, step / total_steps, backward=False)
        run_dir.log({"event": "eval", "step": step, **metrics})
        return metrics

    run_dir.log(
        {
            "event": "resume" if progress.step else "start",
            "step": progress.step,
            "total_steps": total_steps,
            "train_records": len(train_set),
            "heldout_records": len(eval_items),
            "loss_vocab": None if loss_vocab.vocab_ids is None else loss_vocab.vocab_ids.numel(),
        }
    )
    initial = evaluate(0) if progress.step == 0 else None
    bar = tqdm(total=total_steps, initial=progress.step, unit="step", disable=not progress_bar)
    while progress.step < total_steps:
        tick = time.perf_counter()
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + progress.step)
        batch = _batch_at(train_set, progress.step, config.batch_size, config.seed)
        items = [
            prepare_item(s, features, config.anchors_per_seq, block_size, generator) for s in batch
        ]
        drafter.train(train_drafter)
        if head is not None:
            head.train()
        metrics = step_losses(items, loss_vocab, progress.step / total_steps, backward=True)
        torch.nn.utils.clip_grad_norm_(trained, config.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step += 1
        progress.tokens += sum(s.num_tokens for s in batch)
        run_dir.log(
            {
                "event": "train",
                "step": progress.step,
                **{k: v for k, v in metrics.items() if k != "slot_acc"},
                "lr": scheduler.get_last_lr()[0],
                "tokens": progress.tokens,
                "step_s": time.perf_counter() - tick,
            }
        )
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", tau=f"{metrics['accept']:.2f}")
        if progress.step % config.eval_every == 0 and progress.step < total_steps:
            held = evaluate(progress.step)
            if held:
                bar.write(f"step {progress.step}: held-out tau {held['accept']:.3f}")
        if progress.step % config.save_every == 0 or progress.step == total_steps:
            run_dir.save_checkpoint(
                {
                    "model": drafter.state_dict(),
                    "head": head.state_dict() if head is not None else None,
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "step": progress.step,
                    "tokens": progress.tokens,
                    "rng": torch.get_rng_state(),
                    "drafter": dataclasses.asdict(drafter.config),
                }
            )
    bar.close()

    final = evaluate(progress.step)
    extra = {"training": {"steps": progress.step, "heldout": final}}
    if head is None:
        artefact = save_drafter(Path(config.out) / "drafter", drafter, target.info, extra=extra)
    else:
        artefact = save_with_head(
            Path(config.out) / head.kind, drafter, head, target.info, extra=extra
        )
    record = provenance(
        config=dataclasses.asdict(config),
        run_dir=str(Path(config.out).resolve()),
        drafter_config=dataclasses.asdict(drafter.config),
        head_config=dataclasses.asdict(head.config) if head is not None else None,
        target=dataclasses.asdict(target.info),
        started=started,
        finished=datetime.now(UTC).isoformat(),
        steps=progress.step,
        tokens_seen=progress.tokens,
        train_records=len(train_set),
        initial_heldout=initial,
        final_heldout=final,
    )
    (artefact / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")
    run_dir.log({"event": "done", "step": progress.step})
    run_dir.close()
    return {
        "initial": initial,
        "final": final,
        "steps": progress.step,
        "tokens": progress.tokens,
        "drafter": str(artefact),
    }


def _initial_drafter(config, target) -> BlockDrafter:
    """A fresh fp32 drafter shaped by the flags, or the weights of `config.init`."""
    if config.init:
        drafter = load_drafter(config.init, target, dtype=torch.float32)
        return drafter.requires_grad_(True)
    drafter_config = DrafterConfig.for_target(
        target, config.num_layers, config.block_size, config.mask_token_id, config.taps or None
    )
    check_compatible(drafter_config, target.info)
    torch.manual_seed(config.seed)
    return BlockDrafter(drafter_config, target.embed_tokens, target.lm_head).to(target.device)


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


def _resume(run_dir: RunDir, drafter, head, optimizer, scheduler) -> _Progress:
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
    if (state.get("head") is None) != (head is None):
        raise DcocoError(
            f"{run_dir.path} holds a checkpoint of another kind of run (with/without a head); "
            "use another --out or delete its ckpt/"
        )
    drafter.load_state_dict(state["model"])
    if head is not None:
        head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return _Progress(step=state["step"], tokens=state["tokens"])
