"""Does prompt lookup along the corrector's walk add what the copy-hinted drafter misses?

Issue 68 proposed that the DCOCO walk, which knows the tokens it has chosen, look the walked n-gram
up in the context (prompt lookup's index extended by the chosen tokens) and favour the token that
followed its latest occurrence. This measures it on `dcoco heldout`'s blocks (same held-out
records and anchors, fp32) without training anything:

1. the walk with a fixed bonus `beta` added to that candidate's score wherever it is among the
   slot's top-K (n-gram 3..2 or 3..1; from slot 2 on, or from slot 1 too), τ at 3 and 7 slots, and
   τ7 on the two halves of the records (even and odd) apart;
2. teacher-forced, where the walk's pick and the lookup token differ and the lookup token is a
   candidate: how often each one is right, and what a logistic gate on the pair's scores, n-gram
   length, slot and match distance gains, fitted on one half of the records and counted on the
   other (cross-fitted), as net slots (lookup right minus pick right among the overrides).

Usage: .venv/bin/python scripts/reproduce/walk_lookup.py [--method dcoco] [--data-dir ../shared]
"""

from __future__ import annotations

import argparse

import torch

from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.eval.heldout import HeldoutConfig, _corpus_split
from dcoco.models.drafter.copy_hints import NO_HINT, last_match
from dcoco.models.target.loading import load_target
from dcoco.train.block_pass import AnchorRule, block_chunks, prepare_item
from dcoco.train.target_features import TargetFeatures

BETAS = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, float("inf"))


def held_out_blocks(method: str) -> list[tuple]:
    """(record index, context ids, labels [slots], the corrector's Scores of the block: candidate
    ids and logits [slots, K], transitions [slots - 1, K, K], start [K] or None)."""
    config = HeldoutConfig()
    target = load_target(config.target, "fp32")
    _, samples = _corpus_split(config, target.info.vocab_size)
    proposer = build_proposer(method, target, MethodOptions())
    drafter, head = proposer.drafter, proposer.head
    block = drafter.config.block_size
    features = TargetFeatures(target, drafter.config.target_layer_ids, "")
    generator = torch.Generator().manual_seed(0)  # dcoco heldout's anchors
    blocks = []
    with torch.no_grad():
        for index, sample in enumerate(samples):
            if len(sample.response_ids) < block:
                continue
            rule = AnchorRule(config.anchors_per_seq)
            item = prepare_item(sample, features, rule, block, generator, 0, target.device)
            ids, anchors = item.ids.tolist(), item.anchors.tolist()
            for chunk in block_chunks(drafter, item, 32):
                logits = drafter.logits(chunk.hidden, chunk.hint_ids).float()
                scores = head(chunk.hidden, logits, chunk.anchor_ids)
                for b in range(chunk.hidden.shape[0]):
                    anchor = anchors.pop(0)
                    start = None if scores.start is None else scores.start[b]
                    parts = (scores.candidate_ids[b], scores.candidate_logits[b])
                    blocks.append((index, ids[: anchor + 1], chunk.label_ids[b], *parts,
                                   scores.transitions[b], start))  # fmt: skip
    return blocks


def lookup(context: list[int], max_n: int, min_n: int) -> int:
    follow = last_match(torch.tensor(context), max_n, min_n)
    return NO_HINT if follow == NO_HINT or follow >= len(context) else context[follow]


def walk(block, beta: float, min_n: int, first_slot: bool) -> torch.Tensor:
    """The prefix-first walk (slot 1 by the corrector's start scores where it has them, else the
    drafter's top-1), the lookup token's candidate raised by `beta` from slot 2 on, or from slot 1
    with `first_slot`; [slots] bool, right or not."""
    _, context, labels, candidate_ids, candidate_logits, transitions, start = block
    context, path, index = list(context), [], 0
    for p in range(candidate_ids.shape[0]):
        if p == 0 and start is not None:
            row = start.clone()
        elif p == 0:
            row = candidate_logits[0].clone() if first_slot else torch.zeros(0)
        else:
            row = transitions[p - 1, index].clone()
        if beta > 0 and row.numel() and (p > 0 or first_slot):
            token = lookup(context, 3, min_n)
            hit = (candidate_ids[p] == token).nonzero()
            if token != NO_HINT and len(hit):
                row[hit[0, 0]] += min(beta, 1e9)
        index = int(row.argmax()) if row.numel() else 0
        path.append(int(candidate_ids[p, index]))
        context.append(path[-1])
    return torch.tensor(path) == labels


def taus(rows: list[torch.Tensor]) -> tuple[float, float]:
    accepted = torch.stack(rows).long().cumprod(1)
    return tuple((accepted[:, :c].sum(1) + 1).float().mean().item() for c in (3, 7))


def bonus_sweep(blocks) -> None:
    print("| n-gram | from slot | beta | τ3 | τ7 | τ7 even records | τ7 odd records |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for min_n in (2, 1):
        for first_slot in (False, True):
            for beta in BETAS:
                if beta == 0 and (min_n, first_slot) != (2, False):
                    continue
                rows = [walk(b, beta, min_n, first_slot) for b in blocks]
                even = taus([r for r, b in zip(rows, blocks, strict=True) if b[0] % 2 == 0])
                odd = taus([r for r, b in zip(rows, blocks, strict=True) if b[0] % 2 == 1])
                tau3, tau7 = taus(rows)
                print(f"| 3..{min_n} | {1 if first_slot else 2} | {beta:g} | {tau3:.3f} | "
                      f"{tau7:.3f} | {even[1]:.3f} | {odd[1]:.3f} |")  # fmt: skip


def gate_cases(blocks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced slots where the lookup token (n-gram 3..1) is a candidate other than the
    walk's pick: features [cases, 9], outcome [cases] (1 lookup right, -1 pick right, 0
    neither), record parity [cases]."""
    features, outcomes, parity = [], [], []
    for index, context, labels, candidate_ids, candidate_logits, transitions, start in blocks:
        context = list(context)
        for p in range(candidate_ids.shape[0]):
            if p == 0:  # the start scores, else the drafter's top-1 (its logits as the row)
                row = candidate_logits[0] if start is None else start
                pick = int(row.argmax())
            else:
                right = (candidate_ids[p - 1] == labels[p - 1]).nonzero()
                if not len(right):
                    break  # the right prefix left the candidates: the walk cannot follow it
                row = transitions[p - 1, right[0, 0]]
                pick = int(row.argmax())
            found = next(((lookup(context, n, n), n) for n in (3, 2, 1)
                          if lookup(context, n, n) != NO_HINT), (NO_HINT, 0))  # fmt: skip
            label = int(labels[p])
            context.append(label)
            hit = (candidate_ids[p] == found[0]).nonzero()
            if found[0] == NO_HINT or not len(hit) or int(hit[0, 0]) == pick:
                continue
            k = int(hit[0, 0])
            log_norm = torch.logsumexp(candidate_logits[p], 0)
            logit_k, logit_pick = candidate_logits[p, k], candidate_logits[p, pick]
            scores = (row[k] - row[pick], logit_k - logit_pick, logit_k - log_norm)
            kinds = (found[1] == 3, found[1] == 2, p, k)
            features.append([1.0, *map(float, scores), float(logit_pick - log_norm), *kinds])
            picked = int(candidate_ids[p, pick])
            outcomes.append(1.0 if found[0] == label else -1.0 if picked == label else 0.0)
            parity.append(index % 2)
    return torch.tensor(features), torch.tensor(outcomes), torch.tensor(parity)


def fit_gate(features: torch.Tensor, lookup_right: torch.Tensor) -> torch.Tensor:
    """Logistic regression weights [features] (L2 1e-3): P(the lookup token is the right one)."""
    weights = torch.zeros(features.shape[1], requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=200)

    def closure():
        optimizer.zero_grad()
        logits = features @ weights
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, lookup_right.float())
        loss = loss + 1e-3 * weights.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weights.detach()


def cross_fitted_gate(features, outcomes, parity) -> None:
    """A logistic gate (lookup right vs pick right) fitted on one half, counted on the other."""
    scaled = features.clone()
    scaled[:, 1:] = (features[:, 1:] - features[:, 1:].mean(0)) / features[:, 1:].std(0)
    print(f"cases {len(outcomes)}: lookup right {int((outcomes == 1).sum())}, pick right "
          f"{int((outcomes == -1).sum())}, neither {int((outcomes == 0).sum())}")  # fmt: skip
    print("| counted on | threshold | overrides | lookup right | pick right | net slots |")
    print("|---|--:|--:|--:|--:|--:|")
    for half in (0, 1):
        fit = (parity != half) & (outcomes != 0)
        weights = fit_gate(scaled[fit], outcomes[fit] == 1)
        counted = parity == half
        margin = scaled[counted] @ weights
        for threshold in (0.0, 0.5, 1.0, 2.0):
            override = margin > threshold
            gains = int(((outcomes[counted] == 1) & override).sum())
            losses = int(((outcomes[counted] == -1) & override).sum())
            name = "even" if half == 0 else "odd"
            print(f"| {name} records | {threshold:g} | {int(override.sum())} | {gains} | "
                  f"{losses} | {gains - losses:+d} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dcoco", help="a dcoco spec, METHOD[@CHECKPOINT]")
    args = parser.parse_args()
    torch.set_num_threads(2)
    blocks = held_out_blocks(args.method)
    slots = sum(b[2].numel() for b in blocks)
    print(f"{len(blocks)} held-out blocks ({slots} slots), {args.method}, fp32")
    bonus_sweep(blocks)
    cross_fitted_gate(*gate_cases(blocks))


if __name__ == "__main__":
    main()
