"""What the LM head's precision (`--head-dtype target | fp32`) does to each method's speed.

Loads the target at one precision twice, with its own LM head and with the fp32 head
(dcoco.models.target.head_precision), and decodes `dcoco compare`'s built-in prompts with every
method on both, the (head, method) rows taking turns prompt by prompt, so that load elsewhere on the
machine hits them alike. Default flags otherwise (`--num-draft-tokens auto`, `--draft-dtype auto`),
T = 0. Prints per row: tokens/s over all prompts, τ, the speed relative to plain decoding with the
target's head, and how many replies equal that plain's; ratios are within this one run.

Usage: .venv/bin/python scripts/reproduce/head_dtype.py [DTYPE] [METHOD,...] [MAX_NEW_TOKENS]
  (defaults: gguf, plain,pld,dflash,dcoco, 128)
"""

from __future__ import annotations

import sys

import torch

from dcoco.contracts import SamplingParams
from dcoco.decode.cost_curve import machine_fingerprint
from dcoco.decode.session import DecodeConfig, make_engine
from dcoco.eval.compare import BUILTIN_PROMPTS
from dcoco.models.target.loading import load_target

HEADS = ("target", "fp32")


def main(dtype: str, methods: list[str], max_new_tokens: int) -> None:
    machine = machine_fingerprint()
    print(f"{machine['cpu']} ({machine['isa']}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; {dtype}, T = 0, {max_new_tokens} new tokens, "
          f"{len(BUILTIN_PROMPTS)} prompts")  # fmt: skip
    config = DecodeConfig(dtype=dtype)
    rows = {}
    for head in HEADS:
        target = load_target(config.target, dtype, None, "auto", "auto", head)
        for method in methods:
            rows[(head, method)] = (target, make_engine(target, method, config))
    for target, engine in rows.values():  # untimed: first calls build tables and warm kernels
        engine.generate(target.encode_chat(BUILTIN_PROMPTS[0]), 16, SamplingParams())
    totals = {row: {"tokens": 0, "seconds": 0.0, "accepted": 0, "cycles": 0} for row in rows}
    replies: dict = {row: [] for row in rows}
    for prompt in BUILTIN_PROMPTS:
        for row, (target, engine) in rows.items():
            result = engine.generate(target.encode_chat(prompt), max_new_tokens, SamplingParams())
            total = totals[row]
            total["tokens"] += result.stats.new_tokens
            total["seconds"] += result.stats.total_s
            total["cycles"] += result.stats.cycles
            replies[row].append(result.new_ids)
    baseline = ("target", methods[0])
    base_rate = totals[baseline]["tokens"] / totals[baseline]["seconds"]
    print("| head | method | tok/s | τ | vs plain (target head) | replies equal to it |")
    print("|---|---|--:|--:|--:|--:|")
    for row, total in totals.items():
        rate = total["tokens"] / total["seconds"]
        same = sum(a == b for a, b in zip(replies[row], replies[baseline], strict=True))
        print(f"| {row[0]} | {row[1]} | {rate:.1f} | {total['tokens'] / total['cycles']:.2f} | "
              f"{rate / base_rate:.2f}x | {same}/{len(BUILTIN_PROMPTS)} |")  # fmt: skip


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        arguments[0] if arguments else "gguf",
        (arguments[1] if len(arguments) > 1 else "plain,pld,dflash,dcoco").split(","),
        int(arguments[2]) if len(arguments) > 2 else 128,
    )
