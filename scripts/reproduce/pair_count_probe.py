"""How far counted pair statistics alone move the drafter's walk: on `dcoco heldout`'s blocks in
the corrector cache, add lam * log P_count(b | a) (counted on the training replies) to the
drafter's logits of its top-16 candidates at each slot, a being the target's token at the slot
before (the anchor for slot 1), and report the walk's τ and per-slot accuracy for each lam, then
for the best lam per slot. No learned part: what the pair counts carry before a corrector
learns to use them. Usage: .venv/bin/python scripts/reproduce/pair_count_probe.py
(after `dcoco corrector-cache`; env DCOCO_CACHE_DIR)."""

from __future__ import annotations

import glob

import torch

from dcoco.data.bigram import successor_log_probs
from dcoco.data.distill import load_corpus, split_heldout
from dcoco.models.heads.pair_counts import PairCounts
from dcoco.paths import cache_dir, default_corpus

TOP_K = 16
LAMBDAS = (0.0, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7, 1.0)


def main() -> None:
    train, _ = split_heldout(load_corpus(default_corpus("smollm2-135m-instruct")), 32)
    table = successor_log_probs(train, 49152)
    counts = PairCounts(table[0].numel(), 49152)
    counts.fill(*table)
    [path] = glob.glob(str(cache_dir() / "corrector" / "*-s8-k32" / "heldout-*.pt"))
    shard = torch.load(path, mmap=True, weights_only=True)
    ids = shard["candidate_ids"][:, :, :TOP_K].long()  # [blocks, slots, K]
    logits = shard["candidate_logits"][:, :, :TOP_K].float()
    labels = shard["label_ids"].long()
    previous = torch.cat([shard["anchor_ids"].long()[:, None], labels[:, :-1]], dim=1)
    counted = counts(previous[..., None], ids).squeeze(-2)  # [blocks, slots, K]

    def correct(lam) -> torch.Tensor:  # [blocks, slots]; lam: float or [slots]
        scores = logits + torch.as_tensor(lam).reshape(1, -1, 1) * counted
        return ids.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1) == labels

    def tau(hit: torch.Tensor, slots: int) -> float:
        return (hit[:, :slots].long().cumprod(1).sum(1) + 1).float().mean().item()

    for lam in LAMBDAS:
        hit = correct(lam)
        accuracy = " ".join(f"{a:.3f}" for a in hit.float().mean(0).tolist())
        print(f"lam {lam:<4}  tau3 {tau(hit, 3):.3f}  tau7 {tau(hit, 7):.3f}  acc {accuracy}")
    best, reach = [], torch.ones(labels.shape[0], dtype=torch.bool)
    for slot in range(labels.shape[1]):  # per slot, on the blocks the walk reaches there
        hits = [correct(lam)[:, slot] for lam in LAMBDAS]
        pick = max(range(len(LAMBDAS)), key=lambda i: hits[i][reach].float().mean().item())
        best.append(LAMBDAS[pick])
        reach = reach & hits[pick]
    hit = correct(torch.tensor(best))
    print(f"best lam per slot {best}: tau3 {tau(hit, 3):.3f}  tau7 {tau(hit, 7):.3f}")


if __name__ == "__main__":
    main()
