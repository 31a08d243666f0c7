"""What a draft vocabulary (`--draft-vocab`) costs and gains, measured in one run.

Every (method, draft vocab) pair decodes the same prompts, one prompt at a time in turn (so load
elsewhere on the machine hits them alike), at T = 0 with `--num-draft-tokens auto`, beside plain
decoding. Prints per row: tokens/s and its ratio to plain, τ, the draft and correction ms per
cycle, and the share of replies equal to plain decoding's. `--pass-only` instead times one
draft pass per (method, vocab) at 1, 3 and 7 slots, the pairs in turn (median of 60 rounds).

    .venv/bin/python scripts/reproduce/draft_vocab.py --methods dflash,dcoco \
        --vocabs full,16000,8192 --suites gsm8k,humaneval,mtbench --limit 5
    .venv/bin/python scripts/reproduce/draft_vocab.py --pass-only
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from dcoco.decode.cost_curve import CONTEXT, interleaved_ms
from dcoco.decode.methods import build_proposer
from dcoco.decode.proposers import DraftContext
from dcoco.decode.session import DecodeConfig, make_engine, open_target
from dcoco.eval.suites import load_prompts
from dcoco.models.target.cache import crop_cache

SLOTS = (1, 3, 7)
ROUNDS = 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="dflash,dcoco")
    parser.add_argument("--vocabs", default="full,16000,8192")
    parser.add_argument("--suites", default="gsm8k,humaneval,mtbench")
    parser.add_argument("--limit", type=int, default=5, help="prompts per suite")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--data-dir", default="", help="suite files; default ../shared/data")
    parser.add_argument("--num-draft-tokens", default="auto", help="auto, or a fixed count")
    parser.add_argument("--pass-only", action="store_true", help="time draft passes only")
    args = parser.parse_args()

    config = DecodeConfig(
        max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens
    )
    methods = args.methods.split(",")
    target = open_target(config, methods)
    if args.pass_only:
        _time_passes(target, config, methods, args.vocabs.split(","))
        return
    rows = {("plain", "-"): make_engine(target, "plain", config)}
    for method in methods:
        for vocab in args.vocabs.split(","):
            rows[(method, vocab)] = make_engine(target, method, _with(config, vocab))
    prompts = load_prompts(args.data_dir, "", args.suites, args.limit)
    print(f"{target.precision}, {len(prompts)} prompts x {args.max_new_tokens} tokens, T = 0")
    totals: dict = defaultdict(lambda: defaultdict(float))
    for prompt in prompts:
        ids = target.encode_chat(prompt.turns[0])
        plain_ids = None
        for key, engine in rows.items():
            start = time.perf_counter()
            result = engine.generate(ids, args.max_new_tokens)
            row = totals[key]
            row["s"] += time.perf_counter() - start
            row["tokens"] += result.stats.new_tokens
            row["cycles"] += len(result.stats.accept_lengths)
            row["accepted"] += sum(result.stats.accept_lengths)
            row["draft_s"] += result.stats.draft_s
            row["correct_s"] += result.stats.correct_s
            plain_ids = result.new_ids if plain_ids is None else plain_ids
            row["same"] += result.new_ids == plain_ids
    _print(totals, len(prompts))


def _time_passes(target, config: DecodeConfig, methods: list[str], vocabs: list[str]) -> None:
    proposers = {
        (method, vocab): build_proposer(method, target, _with(config, vocab).method_options())
        for method in methods
        for vocab in vocabs
    }
    print(f"{target.precision}: draft + correct ms of one pass, median of {ROUNDS} rounds")
    print("| method | draft vocab | " + " | ".join(f"{s} slots" for s in SLOTS) + " |")
    print("|---|---|" + "--:|" * len(SLOTS))
    cells: dict = defaultdict(list)
    for slots in SLOTS:
        calls = [_one_pass(target, proposer, slots) for proposer in proposers.values()]
        for key, ms in zip(proposers, interleaved_ms(calls, ROUNDS), strict=True):
            cells[key].append(f"{ms:.2f}")
    for (method, vocab), row in cells.items():
        print(f"| {method} | {vocab} | " + " | ".join(row) + " |")


def _one_pass(target, proposer, slots: int):
    """A call that drafts `slots` tokens after a CONTEXT-token cache, as `dcoco profile` does."""
    generator = torch.Generator().manual_seed(0)
    width = target.info.hidden_size * len(proposer.feature_layers)
    tokens = torch.randint(0, target.info.vocab_size, (CONTEXT + 2,), generator=generator)
    features = torch.randn(1, CONTEXT + 2, width, generator=generator).to(target.dtype)
    proposer.start(tokens[:CONTEXT].tolist())
    proposer.propose(DraftContext(tokens[:CONTEXT], features[:, :CONTEXT], slots))

    def call():
        proposer.propose(DraftContext(tokens, features[:, CONTEXT - 1 :], slots))
        crop_cache(proposer.cache, CONTEXT - 1)

    return call


def _with(config: DecodeConfig, vocab: str) -> DecodeConfig:
    return DecodeConfig(**{**config.__dict__, "draft_vocab": vocab})


def _print(totals: dict, count: int) -> None:
    plain_rate = totals[("plain", "-")]["tokens"] / totals[("plain", "-")]["s"]
    print("| method | draft vocab | tok/s | vs plain | τ | draft ms/cycle | correct ms/cycle | "
          "match |\n|---|---|--:|--:|--:|--:|--:|--:|")  # fmt: skip
    for (method, vocab), row in totals.items():
        rate, cycles = row["tokens"] / row["s"], max(row["cycles"], 1)
        print(
            f"| {method} | {vocab} | {rate:.1f} | {rate / plain_rate:.2f}x | "
            f"{row['accepted'] / cycles:.2f} | {1000 * row['draft_s'] / cycles:.2f} | "
            f"{1000 * row['correct_s'] / cycles:.2f} | {row['same'] / count:.0%} |"
        )


if __name__ == "__main__":
    main()
