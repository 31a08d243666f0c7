"""Drop-in head training from the corrector cache (dcoco.train.corrector_cache).

With the drafter frozen, its pass over every training block is read back from the cache, so a
step costs the head's forward and backward only: thousands of blocks a second on a CPU, and a
whole corpus per epoch. Each step takes `blocks_per_step` blocks of a fresh permutation of all
cached training blocks per epoch (seeded by the run's seed), so a run resumed from `<out>/ckpt/`
continues exactly where it stopped. Every `eval_every` steps the head is measured on the cached
held-out blocks, `dcoco heldout`'s own: the walk's τ, its per-slot accuracy against the drafter's
top-1 on the same rows, and the rows it fixed and broke.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from tqdm import tqdm

from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.heads.base import Candidates, HeadBatch
from dcoco.models.heads.head_io import save_with_head
from dcoco.models.target.loading import load_target
from dcoco.paths import portable
from dcoco.train.blocks import slot_weights
from dcoco.train.corrector_cache import CorrectorCacheConfig, drafter_path, open_cache
from dcoco.train.loop import warmup_cosine
from dcoco.train.run_dir import RunDir, provenance

SNAPSHOT = "snapshot"
EVAL_CHUNK = 256
TAUS = (3, 7)


def head_batch(shard: dict, rows: torch.Tensor, weights, drafter=None, progress=1.0) -> HeadBatch:
    """The blocks `rows` of a shard as a HeadBatch; with `drafter`, the full logits too (the
    sequential heads read them; the corrector needs only the candidates)."""
    pick = {name: value[rows] for name, value in shard.items() if name != "version"}
    hidden = pick["hidden"].float()
    labels = pick["label_ids"].long()
    logits = None
    if drafter is not None:
        with torch.no_grad():
            hints = pick["hint_ids"].long()
            logits = drafter.logits(hidden.to(drafter.dtype), hints).float()
    return HeadBatch(
        hidden=hidden,
        logits=logits,
        vocab_ids=None,
        anchor_ids=pick["anchor_ids"].long(),
        label_ids=labels,
        label_index=labels,
        slot_weights=weights,
        progress=progress,
        candidates=Candidates(
            pick["candidate_ids"],
            pick["candidate_logits"],
            pick["logsumexp"],
            pick["label_logits"],
        ),  # fmt: skip
    )


def _blocks_of(shard: dict) -> int:
    return shard["anchor_ids"].shape[0]


def evaluate(head, heldout: dict, weights, drafter) -> dict:
    """The walk's held-out metrics on the cached held-out blocks."""
    head.eval()
    corrects, top1s = [], []
    with torch.no_grad():
        for start in range(0, _blocks_of(heldout), EVAL_CHUNK):
            rows = torch.arange(start, min(start + EVAL_CHUNK, _blocks_of(heldout)))
            batch = head_batch(heldout, rows, weights, drafter)
            corrects.append(head.training_loss(batch).correct)
            top1s.append(batch.candidates.ids[:, :, 0].long() == batch.label_ids)
    correct, top1 = torch.cat(corrects), torch.cat(top1s)
    head.train()

    def tau(c, slots):
        return round((c[:, :slots].long().cumprod(1).sum(1) + 1).float().mean().item(), 4)

    return {
        "blocks": correct.shape[0],
        "accept": tau(correct, correct.shape[1]),
        "drafter_accept": tau(top1, top1.shape[1]),
        **{f"tau_{s}": tau(correct, s) for s in TAUS},
        **{f"drafter_tau_{s}": tau(top1, s) for s in TAUS},
        "slot_acc": [round(v, 4) for v in correct.float().mean(0).tolist()],
        "drafter_slot_acc": [round(v, 4) for v in top1.float().mean(0).tolist()],
        "fixed": (correct & ~top1).sum(0).tolist(),
        "broken": (~correct & top1).sum(0).tolist(),
    }


def train_from_cache(config, build_head, target=None, progress_bar: bool = True) -> dict:
    """Train (or resume) a drop-in head on the corrector cache of `config.init`."""
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    target = target or load_target(config.target, config.target_dtype, config.device or None)
    shards, heldout, root = _open_cache(config, target, progress_bar)
    drafter = load_drafter(
        drafter_path(config.init, target), target, dtype=torch.float32
    ).requires_grad_(False)
    torch.manual_seed(config.seed)
    head = build_head(drafter).float()
    logits_from = drafter if head.kind != "dcoco" else None  # the corrector reads candidates
    counts = torch.tensor([_blocks_of(s) for s in shards])
    bounds = counts.cumsum(0)
    total = int(bounds[-1])
    per_epoch = math.ceil(total / config.blocks_per_step)
    total_steps = config.max_steps or config.epochs * per_epoch
    optimizer, scheduler = _optimizer(config, head, total_steps)
    weights = slot_weights(drafter.config.block_size, config.gamma)[1:]
    run_dir = RunDir(config.out)
    step = _resume(run_dir, head, optimizer, scheduler)
    run_dir.log({"event": "resume" if step else "start", "step": step, "total_steps": total_steps,
                 "train_blocks": total, "cache": portable(root), "head": head.kind})  # fmt: skip
    state = {"initial": None, "last": None, "started": time.time()}
    if step == 0:
        state["initial"] = evaluate(head, heldout, weights, logits_from)
        run_dir.log({"event": "eval", "step": 0, **state["initial"]})
    bar = tqdm(total=total_steps, initial=step, unit="step", disable=not progress_bar)
    while step < total_steps:
        tick = time.perf_counter()
        epoch, index = divmod(step, per_epoch)
        order = torch.randperm(total, generator=torch.Generator().manual_seed(config.seed + epoch))
        chosen = order[index * config.blocks_per_step : (index + 1) * config.blocks_per_step]
        loss, parts = _accumulate(config, head, shards, bounds, counts, chosen, weights,
                                  logits_from, step / total_steps)  # fmt: skip
        grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")
        run_dir.log({"event": "train", "step": step, "epoch": epoch, "loss": loss,
                     "blocks": chosen.numel(),
                     **{k: round(v, 5) for k, v in parts.items()},
                     "grad_norm": round(grad_norm.item(), 4), "lr": scheduler.get_last_lr()[0],
                     "step_s": round(time.perf_counter() - tick, 3)})  # fmt: skip
        if step % config.eval_every == 0 or step == total_steps:
            state["last"] = evaluate(head, heldout, weights, logits_from)
            run_dir.log({"event": "eval", "step": step, **state["last"]})
            bar.write(f"step {step}: held-out tau3 {state['last']['tau_3']:.3f} "
                      f"tau7 {state['last']['tau_7']:.3f}")  # fmt: skip
        if step % config.save_every == 0 or step == total_steps:
            _save(config, run_dir, drafter, head, optimizer, scheduler, step, target, state,
                  total, total_steps, SNAPSHOT)  # fmt: skip
    bar.close()
    artefact = _save(config, run_dir, drafter, head, optimizer, scheduler, step, target, state,
                     total, total_steps, head.kind)  # fmt: skip
    run_dir.log({"event": "done", "step": step})
    run_dir.close()
    return {"initial": state["initial"], "final": state["last"], "steps": step,
            "drafter": str(artefact)}  # fmt: skip


def _open_cache(config, target, progress_bar: bool):
    """(training shards, held-out shard, cache dir) of the run: its drafter's cache, built where
    missing with `cache_build`, cut to the first `cache_parts` parts."""
    cache = CorrectorCacheConfig(
        drafter=config.init, target=config.target, corpus=config.corpus,
        dtype=config.target_dtype, stride=config.cache_stride, top_k=max(32, config.top_k),
        heldout=config.heldout, threads=config.threads, build=config.cache_build,
    )  # fmt: skip
    shards, heldout, root = open_cache(cache, target, progress_bar)
    return shards[: config.cache_parts or None], heldout, root


def _optimizer(config, head, total_steps: int):
    """AdamW with the shared loop's warmup-cosine schedule."""
    optimizer = torch.optim.AdamW(
        head.parameters(), lr=config.head_lr or config.lr, weight_decay=config.weight_decay
    )
    warmup = max(1, math.ceil(config.warmup_ratio * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup, total_steps)
    )
    return optimizer, scheduler


def _accumulate(config, head, shards, bounds, counts, chosen, weights, drafter, progress):
    """Gradients of one step's blocks `chosen` (global indices), read shard by shard; returns
    the step's loss, Sum w*loss / Sum w, and its named parts on the same scale."""
    denominator = float(weights.sum()) * chosen.numel()
    shard_of = torch.searchsorted(bounds, chosen, right=True)
    loss, parts = 0.0, {}
    for s in shard_of.unique().tolist():
        rows = (chosen[shard_of == s] - (bounds[s] - counts[s])).sort().values
        batch = head_batch(shards[s], rows, weights, drafter, progress)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.autocast):
            out = head.training_loss(batch)
        (out.weighted_loss / denominator).backward()
        loss += out.weighted_loss.item() / denominator
        for name, value in (out.parts or {}).items():
            parts[name] = parts.get(name, 0.0) + value.item() / denominator
    return loss, parts


def _resume(run_dir: RunDir, head, optimizer, scheduler) -> int:
    saved = run_dir.load_checkpoint(torch.device("cpu"))
    if saved is None:
        return 0
    head.load_state_dict(saved["head"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"])
    return saved["step"]


def _save(config, run_dir, drafter, head, optimizer, scheduler, step, target, state, blocks,
          total_steps, name) -> Path:  # fmt: skip
    """The resumable state, and `<out>/<name>/`: drafter + head with its provenance."""
    run_dir.save_checkpoint({"head": head.state_dict(), "optimizer": optimizer.state_dict(),
                             "scheduler": scheduler.state_dict(), "step": step,
                             "rng": torch.get_rng_state()})  # fmt: skip
    extra = {"training": {"steps": step, "heldout": state["last"]}}
    artefact = save_with_head(Path(config.out) / name, drafter, head, target.info, extra=extra)
    record = provenance(
        config=dataclasses.asdict(config), head_config=dataclasses.asdict(head.config),
        features="corrector cache", train_blocks=blocks, steps=step, total_steps=total_steps,
        started=datetime.fromtimestamp(state["started"], UTC).isoformat(),
        finished=datetime.now(UTC).isoformat(), initial_heldout=state["initial"],
        final_heldout=state["last"],
    )  # fmt: skip
    (artefact / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")
    return artefact
