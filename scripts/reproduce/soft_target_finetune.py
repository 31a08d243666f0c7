"""Does a soft-target loss teach the drafter to draft after a sampled anchor? Fine-tunes the
shipped `dflash` on the cross-entropy to the target's own T = 1 distribution over the loss
vocabulary's 16,000 most frequent tokens (computed online: one target forward per record gives
the taps and the teacher), SOFT_WEIGHT of it beside the hard label's cross-entropy, on records
drawn MIX_SHARE from the target's sampled replies ($DCOCO_CACHE_DIR/corpus/smollm2-t1-train,
`dcoco datagen --temperature 1`) and the rest from its greedy corpus; saves the drafter to OUT
(read it back with scripts/reproduce/sampled_acceptance.py OUT).

Measured once (results/sampled-drafts/smollm2-sampled-drafts): 1,500 steps at lr 3e-4, SOFT_WEIGHT
1, MIX_SHARE 0.5 (9 min on 2 cores): the sampled draft's slot-1 acceptance after a sampled anchor
went from 0.355 to 0.368, the argmax's from 0.262 to 0.271. Not shipped.

Usage: .venv/bin/python scripts/reproduce/soft_target_finetune.py \
  STEPS LR SOFT_WEIGHT OUT [MIX_SHARE]   # 1500 3e-4 1.0 runs/soft-a 0.5
"""

from __future__ import annotations

import math
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dcoco.data.distill import load_corpus, split_heldout
from dcoco.models.drafter.drafter_io import load_drafter, save_drafter
from dcoco.models.target.loading import DEFAULT_TARGET, load_target
from dcoco.paths import cache_dir, checkpoints_dir, default_corpus
from dcoco.train.block_pass import AnchorRule, Item, LossVocab, block_chunks
from dcoco.train.blocks import slot_weights

SOURCE = checkpoints_dir() / DEFAULT_TARGET / "dflash"


def records(block: int):
    """(greedy training records, sampled records not answering a held-out prompt)."""
    greedy = [
        s for s in load_corpus(default_corpus(DEFAULT_TARGET)) if len(s.response_ids) >= block
    ]
    train, heldout = split_heldout(greedy, 32)
    held_prompts = {s.prompt_ids for s in heldout}
    sampled = load_corpus(cache_dir() / "corpus/smollm2-t1-train")
    sampled = [s for s in sampled if len(s.response_ids) >= block]
    return train, [s for s in sampled if s.prompt_ids not in held_prompts]


def step_loss(target, drafter, vocab, sample, step, soft_weight, weights) -> float:
    """One record's blocks: backward of the weighted soft + hard cross-entropy; its mean."""
    block = drafter.config.block_size
    ids = torch.tensor(sample.input_ids)
    with torch.no_grad():
        out = target.forward(ids[None], feature_layers=tuple(drafter.config.target_layer_ids))
    teacher = out.logits[0].float()[:, vocab.vocab_ids].log_softmax(-1)  # [tokens, V']
    anchors = AnchorRule(32, 4, 0).anchors(sample, block, step, None)
    item = Item(ids=ids, features=out.features.clone(), anchors=anchors)
    total, weight = 0.0, 0.0
    chunks = block_chunks(drafter, item, 32)
    for chunk, chunk_anchors in zip(chunks, anchors.split(32), strict=True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = vocab.logits(chunk.hidden)
        log_q = logits.float().log_softmax(-1)  # [n, slots, V']
        # the label of slot j is the token at anchor + j; the target predicted it one before
        positions = chunk_anchors[:, None] + torch.arange(block - 1)[None]
        soft = -(teacher[positions].exp() * log_q).sum(-1)  # [n, slots]
        labels = vocab.label_index(chunk.label_ids)
        hard = F.cross_entropy(log_q.flatten(0, 1), labels.flatten(), ignore_index=-100,
                               reduction="none").view_as(labels)  # fmt: skip
        loss = ((soft_weight * soft + (1 - soft_weight) * hard) * weights).sum()
        (loss / (len(anchors) * weights.sum())).backward()
        total += loss.item()
        weight += weights.sum().item() * chunk.hidden.shape[0]
    return total / weight


def main(steps: int, lr: float, soft_weight: float, out: str, mix_share: float) -> None:
    torch.set_num_threads(2)
    target = load_target(DEFAULT_TARGET, "bf16")
    drafter = load_drafter(SOURCE, target, dtype=torch.float32)
    drafter.requires_grad_(True)  # the shared embedding and LM head are not its parameters
    block = drafter.config.block_size
    greedy, sampled = records(block)
    vocab = LossVocab.most_frequent(drafter, greedy + sampled, 16000)
    weights = slot_weights(block, 4.0)[1:]  # gamma 4, as the recipes
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1, (s + 1) / 30) * 0.5 * (1 + math.cos(math.pi * s / steps)),
    )
    rng, started = random.Random(0), time.time()
    drafter.train()
    for step in range(steps):
        sample = rng.choice(sampled) if rng.random() < mix_share else rng.choice(greedy)
        loss = step_loss(target, drafter, vocab, sample, step, soft_weight, weights)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print(f"step {step} loss {loss:.3f} {time.time() - started:.0f}s", file=sys.stderr)
    save_drafter(out, drafter, target.info)
    for path in SOURCE.iterdir():  # the training log (the auto prior), provenance
        if not (Path(out) / path.name).exists():
            shutil.copy(path, Path(out) / path.name)
    print(f"saved {out} after {time.time() - started:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(int(arguments[0]), float(arguments[1]), float(arguments[2]), arguments[3],
         float(arguments[4]) if len(arguments) > 4 else 0.5)  # fmt: skip
