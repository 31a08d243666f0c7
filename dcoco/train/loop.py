"""The training loop shared by `dcoco train-drafter` and `dcoco train-corrector`.

Each step takes `batch_size` sequences, reads their target taps (from the feature cache, or
computed once per step without grad), picks their blocks (random anchors, or dense strided ones)
and runs them through the drafter (dcoco.train.block_pass). Without a head the loss is the
drafter's; with one it is the head's, plus the drafter's when the drafter trains too (joint), or
the head's alone over a frozen drafter (drop-in).

Losses are Sum w*loss / Sum w over the batch's labelled slots, with gradients accumulated chunk by
chunk. Batch order and anchors derive from (seed, step), so a run resumed from `<out>/ckpt/`
continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from dcoco.data.distill import Sample, load_corpus, part_record_ids, split_heldout
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig, check_compatible
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.target.loading import load_target
from dcoco.train.block_pass import (
    AnchorRule,
    LossVocab,
    prepare_item,
)
from dcoco.train.blocks import slot_weights
from dcoco.train.corpus_mix import mix_in, open_features
from dcoco.train.distributed import finish, init_ranks, rank_device, sum_gradients
from dcoco.train.grow import grow_drafter
from dcoco.train.run_dir import RunDir
from dcoco.train.run_end import artefact_dir, finish_run, save_artefact, write_provenance
from dcoco.train.run_state import HeadSetup, Run
from dcoco.train.step import bigram_baseline, context_window, evaluate, step_losses
from dcoco.train.warm_start import warm_start_from_target

SNAPSHOT = "snapshot"  # <out>/snapshot/: the latest saved weights as a loadable checkpoint
ITEM_SEED_STRIDE = 7919  # record i of a step's batch draws its anchors from seed + i * this


def run_training(config, target, samples, progress_bar: bool, head_setup: HeadSetup | None):
    """Train (or resume) as `config` says; returns the held-out metrics and the artefact path."""
    run = setup(config, target, samples, head_setup)
    writer = run.ranks.writer  # evaluation, logs and checkpoints: rank 0 alone
    initial = evaluate(run) if run.step == 0 and writer else None
    run.initial_eval = initial
    bar = tqdm(
        total=run.total_steps, initial=run.step, unit="step", disable=not progress_bar or not writer
    )
    while run.step < run.total_steps:
        metrics = train_step(run)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", tau=f"{metrics['accept']:.2f}")
        if run.step % config.eval_every == 0 and run.step < run.total_steps and writer:
            held = evaluate(run)
            if held:
                bar.write(f"step {run.step}: held-out tau {held['accept']:.3f}")
        if (run.step % config.save_every == 0 or run.step == run.total_steps) and writer:
            save_state(run)
    bar.close()
    if writer:
        summary = finish_run(run, initial, evaluate(run))
    else:  # what rank 0 reports, less the metrics only it measures
        summary = {"initial": None, "final": None, "steps": run.step, "tokens": run.tokens,
                   "drafter": str(artefact_dir(run))}  # fmt: skip
    finish(run.ranks)
    return summary


def setup(config, target, samples, head_setup: HeadSetup | None) -> Run:
    """Load the target, corpus and drafter, build the optimizer and resume from `<out>/ckpt/`."""
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    ranks = init_ranks(config.device)
    from_corpus = samples is None
    if target is None:
        device = rank_device(config.device, ranks)
        target = load_target(config.target, config.target_dtype, device or None)
    if samples is None:
        samples = load_corpus(config.corpus, config.max_records or None, config.max_seq_len)
    drafter = _initial_drafter(config, target)
    # A response shorter than a block has no full block to train on.
    samples = [s for s in samples if len(s.response_ids) >= drafter.config.block_size]
    train_set, heldout = split_heldout(samples, config.heldout)
    if config.cache_parts:  # after the split: the same held-out blocks
        trained_ids = part_record_ids(config.corpus, config.cache_parts)
        train_set = [s for s in train_set if s.id in trained_ids]
    train_set = mix_in(config, train_set, heldout, drafter.config.block_size)  # after the filter
    if not train_set:
        raise DcocoError(
            f"no training record has a response of >= {drafter.config.block_size} tokens"
        )
    torch.manual_seed(config.seed)
    head = head_setup.build(drafter).to(target.device) if head_setup else None
    train_drafter = head_setup is None or head_setup.train_drafter
    drafter.requires_grad_(train_drafter)
    trained = [
        *(drafter.parameters() if train_drafter else []),
        *(head.parameters() if head else []),
    ]
    total_steps = config.max_steps or config.epochs * math.ceil(len(train_set) / config.batch_size)
    groups = [{"params": list(drafter.parameters()) if train_drafter else []}]
    if head is not None:  # a head may learn at its own rate (a drafter it joins is trained)
        groups.append({"params": list(head.parameters()), "lr": head_setup.lr or config.lr})
    groups = [g for g in groups if g["params"]]
    optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    warmup = max(1, math.ceil(config.warmup_ratio * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup, total_steps)
    )
    features = open_features(
        config, target, drafter.config.target_layer_ids, samples if from_corpus else None, ranks
    )
    rule = AnchorRule(config.anchors_per_seq, config.anchor_stride, config.seed)
    run = Run(
        config=config,
        target=target,
        drafter=drafter,
        head=head,
        train_drafter=train_drafter,
        head_weight=head_setup.loss_weight if head_setup and train_drafter else 1.0,
        train_set=train_set,
        eval_items=_eval_items(heldout, features, config, drafter.config.block_size, target),
        features=features,
        trained=trained,
        optimizer=optimizer,
        scheduler=scheduler,
        run_dir=RunDir(config.out, writer=ranks.writer),
        weights=slot_weights(drafter.config.block_size, config.gamma)[1:].to(target.device),
        loss_vocab=LossVocab.most_frequent(drafter, train_set, config.loss_vocab),
        full_vocab=LossVocab(drafter, None),
        anchor_rule=rule,
        total_steps=total_steps,
        started=time.time(),
        ranks=ranks,
    )
    _resume(run)
    _log_start(run, len(heldout))
    return run


def _eval_items(heldout, features, config, block_size: int, target) -> list:
    """The held-out blocks, fixed for the whole run: random anchors from the run's seed."""
    generator = torch.Generator().manual_seed(config.seed)
    rule = AnchorRule(config.anchors_per_seq)
    return [
        prepare_item(s, features, rule, block_size, generator, 0, target.device) for s in heldout
    ]


def _log_start(run: Run, heldout: int) -> None:
    vocab_ids = run.loss_vocab.vocab_ids
    run.run_dir.log(
        {
            "event": "resume" if run.step else "start",
            "step": run.step,
            "total_steps": run.total_steps,
            "train_records": len(run.train_set),
            "heldout_records": heldout,
            "loss_vocab": None if vocab_ids is None else vocab_ids.numel(),
            "features": type(run.features).__name__,
        }
    )
    baseline = bigram_baseline(run) if run.step == 0 and run.ranks.writer else None
    if baseline:
        run.run_dir.log({"event": "baseline", "kind": "count bigram", "step": 0, **baseline})


def train_step(run: Run) -> dict:
    """One optimizer step on the batch of `run.step`; logs and returns its metrics."""
    tick = time.perf_counter()
    config = run.config
    epoch, batch = _batch_at(run.train_set, run.step, config.batch_size, config.seed)
    # Each record's anchors from its own place in the batch, so a rank draws for its share
    # exactly what one process draws for the whole batch.
    seed = config.seed * 1_000_003 + run.step
    items = [
        prepare_item(
            batch[i],
            run.features,
            run.anchor_rule,
            run.block_size,
            torch.Generator().manual_seed(seed + ITEM_SEED_STRIDE * i),
            epoch,
            run.target.device,
        )
        for i in run.ranks.share(list(range(len(batch))))
    ]
    run.drafter.train(run.train_drafter)
    if run.head is not None:
        run.head.train()
    metrics = step_losses(run, items, run.loss_vocab, backward=True)
    sum_gradients(run.trained, run.ranks)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.trained, config.grad_clip)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.step += 1
    run.tokens += sum(s.num_tokens for s in batch)
    run.run_dir.log(
        {
            "event": "train",
            "step": run.step,
            "epoch": epoch,
            **{k: v for k, v in metrics.items() if k != "slot_acc"},
            "grad_norm": round(grad_norm.item(), 4),
            "context_window": context_window(config, run.step - 1),
            "lr": run.scheduler.get_last_lr()[0],
            "tokens": run.tokens,
            "step_s": round(time.perf_counter() - tick, 3),
        }
    )
    return metrics


def save_state(run: Run) -> None:
    """The resumable checkpoint, and `<out>/snapshot/`: the weights so far as a checkpoint that
    decoding and `dcoco heldout` load while a long run goes on."""
    run.run_dir.save_checkpoint(
        {
            "model": run.drafter.state_dict(),
            "head": run.head.state_dict() if run.head is not None else None,
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(),
            "step": run.step,
            "tokens": run.tokens,
            "rng": torch.get_rng_state(),
            "drafter": dataclasses.asdict(run.drafter.config),
        }
    )
    snapshot = save_artefact(run, Path(run.config.out) / SNAPSHOT, run.last_eval)
    write_provenance(run, snapshot, run.initial_eval, run.last_eval)


def _initial_drafter(config, target) -> BlockDrafter:
    """A fresh fp32 drafter shaped by the flags, or the weights of `config.init`."""
    if config.init:
        drafter = load_drafter(config.init, target, dtype=torch.float32)
        if config.copy_hints:
            drafter.config = dataclasses.replace(drafter.config, copy_hints=True)
        if config.copy_gate and drafter.copy_gate is None:
            drafter.add_copy_gate()
        return grow_drafter(drafter, config.add_layers, config.seed).requires_grad_(True)
    drafter_config = DrafterConfig.for_target(
        target, config.num_layers, config.block_size, config.mask_token_id, config.taps or None
    )
    drafter_config = dataclasses.replace(
        drafter_config, copy_hints=config.copy_hints or config.copy_gate, copy_gate=config.copy_gate
    )
    check_compatible(drafter_config, target.info)
    torch.manual_seed(config.seed)
    drafter = BlockDrafter(drafter_config, target.embed_tokens, target.lm_head)
    if config.init_from_target:
        warm_start_from_target(drafter, target)
    return drafter.to(target.device)


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def _batch_at(samples: list[Sample], step: int, batch_size: int, seed: int):
    """(epoch, the sequences of `step`): a fresh permutation of the training split each epoch."""
    per_epoch = math.ceil(len(samples) / batch_size)
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed + epoch))
    return epoch, [
        samples[i] for i in order[index * batch_size : (index + 1) * batch_size].tolist()
    ]


def _resume(run: Run) -> None:
    """Load `<out>/ckpt/` into the fresh objects, if a checkpoint is there."""
    state = run.run_dir.load_checkpoint(run.drafter.fc.weight.device)
    if state is None:
        return
    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in state["drafter"].items()}
    if stored != dataclasses.asdict(run.drafter.config):
        raise DcocoError(
            f"{run.run_dir.path} holds a checkpoint of another drafter ({stored}); use another "
            "--out or delete its ckpt/"
        )
    if (state.get("head") is None) != (run.head is None):
        raise DcocoError(
            f"{run.run_dir.path} holds a checkpoint of another kind of run (with/without a "
            "head); use another --out or delete its ckpt/"
        )
    run.drafter.load_state_dict(state["model"])
    if run.head is not None:
        run.head.load_state_dict(state["head"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    run.step, run.tokens = state["step"], state["tokens"]
