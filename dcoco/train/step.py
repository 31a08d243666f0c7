"""One pass of losses over a batch of sequences, the held-out evaluation and the count baseline
on the held-out blocks; the training loop (dcoco.train.loop) calls them.

Losses are Sum w*loss / Sum w over the labelled slots, with gradients accumulated chunk by chunk:
a step's records go through the drafter `--records-per-forward` at a time (one batch of the
forward), so a step of `--batch-size` records accumulates the gradients of its forwards.
"""

from __future__ import annotations

import contextlib

import torch

from dcoco.data.bigram import CountBigram
from dcoco.train.block_pass import IGNORE, LossVocab, chunk_losses, record_chunks
from dcoco.train.blocks import acceptance_stats
from dcoco.train.distributed import SINGLE, Ranks, all_cat, all_sum
from dcoco.train.run_state import Run


def bigram_baseline(run: Run) -> dict | None:
    """The count bigram (x_t -> x_{t+k}, counted on the training split) on the held-out blocks:
    the per-slot accuracy and simulated acceptance a drafter must beat."""
    if not run.eval_items:
        return None
    bigram = CountBigram(run.train_set, run.block_size - 1, run.drafter.config.vocab_size)
    correct = []
    for item in run.eval_items:
        labels = _labels(item, run.block_size)  # [blocks, slots]
        correct.append(bigram.predict(item.ids[item.anchors]) == labels)
    correct = torch.cat(correct)
    slot_acc, accepted = acceptance_stats(correct)
    return {
        "accept": accepted.mean().item(),
        "tau_3": acceptance_stats(correct[:, :3])[1].mean().item(),
        "slot_acc": [round(a, 4) for a in slot_acc.tolist()],
    }


def _autocast(run: Run):
    """bf16 autocast around the drafter and head when asked (fp32 master weights)."""
    if not run.config.autocast:
        return contextlib.nullcontext()
    return torch.autocast(run.target.device.type, dtype=torch.bfloat16)


def context_window(config, step: int) -> int:
    """The curriculum's context window at `step`: `--context-window` positions, doubling every
    `--window-doubling-steps` steps; 0 (all of the context) once it is past any sequence."""
    if config.context_window <= 0:
        return 0
    window = config.context_window * 2 ** (step // config.window_doubling_steps)
    return 0 if window >= config.max_seq_len else window


def step_losses(run: Run, items, vocab: LossVocab, backward: bool) -> dict:
    """Losses and acceptance over `items`; with `backward`, their gradients accumulated (under
    the context-window curriculum; evaluation sees the whole context, as inference does)."""
    window = context_window(run.config, run.step) if backward else 0
    # Training in a data-parallel run: `items` are this rank's share of the batch; the loss is
    # normalised by the whole batch's weight and the metrics cover the whole batch. (Held-out
    # evaluation runs on rank 0 alone.)
    ranks = run.ranks if backward else SINGLE
    labelled = [vocab.label_index(_labels(item, run.block_size)) != IGNORE for item in items]
    local_weight = sum(float((m.float() @ run.weights).sum()) for m in labelled)
    weight_total = max(all_sum([local_weight], ranks)[0], 1e-9)  # labels outside carry none
    totals = {"drafter": 0.0, "head": 0.0}
    drafter_correct, head_correct = [], []
    progress = run.step / run.total_steps
    per_forward = run.config.records_per_forward
    for first in range(0, len(items), per_forward):
        group = items[first : first + per_forward]
        chunks = record_chunks(run.drafter, group, run.config.anchor_chunk, window)
        while True:
            # The drafter's forward runs inside next(), so autocast must cover it; the backward
            # runs outside, as autocast asks.
            with _autocast(run):
                chunk = next(chunks, None)
                if chunk is None:
                    break
                out = chunk_losses(
                    run.drafter, run.head, chunk, vocab, run.weights, progress, run.train_drafter
                )
            loss = out.drafter_loss if run.train_drafter else out.drafter_loss.detach()
            if run.head is not None:
                loss = (loss if run.train_drafter else 0) + run.head_weight * out.head_loss
                totals["head"] += out.head_loss.item()
                head_correct.append(out.head_correct)
            if backward:
                (loss / weight_total).backward()
            totals["drafter"] += out.drafter_loss.item()
            drafter_correct.append(out.drafter_correct)
    totals["drafter"], totals["head"] = all_sum([totals["drafter"], totals["head"]], ranks)
    blocks = int(all_sum([sum(item.anchors.numel() for item in items)], ranks)[0])
    drafter_correct = _gathered(drafter_correct, ranks)
    head_correct = _gathered(head_correct, ranks)
    return _metrics(totals, weight_total, drafter_correct, head_correct, blocks)


def _gathered(corrects: list[torch.Tensor], ranks: Ranks) -> list[torch.Tensor]:
    """[blocks, slots] correctness of every rank's blocks (this rank's alone with one)."""
    if ranks.world == 1:
        return corrects
    local = torch.cat(corrects) if corrects else torch.zeros(0, dtype=torch.bool)
    gathered = all_cat(local, ranks)
    return [gathered] if gathered.numel() else []


def _labels(item, block_size: int) -> torch.Tensor:
    """[blocks, slots] same-position labels of `item`'s blocks (they are full)."""
    offsets = torch.arange(1, block_size, device=item.anchors.device)
    return item.ids[item.anchors[:, None] + offsets]


def _metrics(totals, weight_total, drafter_correct, head_correct, blocks: int) -> dict:
    if not drafter_correct:  # every reply of the batch too short for its strided anchors
        return {"loss": 0.0, "accept": 1.0, "slot_acc": [], "blocks": 0}
    correct = torch.cat(drafter_correct)  # [blocks, slots]
    slot_acc, accepted = acceptance_stats(correct)
    metrics = {
        "loss": totals["drafter"] / weight_total,
        "accept": accepted.mean().item(),
        "tau_3": acceptance_stats(correct[:, :3])[1].mean().item(),
        "slot_acc": [round(a, 4) for a in slot_acc.tolist()],
        "blocks": blocks,
    }
    if head_correct:
        head_all = torch.cat(head_correct)
        head_acc, head_accepted = acceptance_stats(head_all)
        metrics.update(
            drafter_loss=metrics["loss"],
            drafter_accept=metrics["accept"],
            loss=totals["head"] / weight_total,
            accept=head_accepted.mean().item(),
            tau_3=acceptance_stats(head_all[:, :3])[1].mean().item(),
            slot_acc=[round(a, 4) for a in head_acc.tolist()],
        )
    return metrics


def evaluate(run: Run) -> dict | None:
    """Held-out loss, per-slot accuracy and simulated acceptance over the full vocabulary."""
    if not run.eval_items:
        return None
    run.drafter.eval()
    if run.head is not None:
        run.head.eval()
    with torch.no_grad():
        metrics = step_losses(run, run.eval_items, run.full_vocab, backward=False)
    run.run_dir.log({"event": "eval", "step": run.step, **metrics})
    run.last_eval = {"step": run.step, **metrics}
    return metrics
