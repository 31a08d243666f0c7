"""What the KV cache costs a decoding step: transformers' DynamicCache (one `torch.cat` of a
layer's whole K/V per forward) against dcoco's growing cache (new positions written into spare
room, dcoco.models.target.cache), in the K/V's own dtype and as decoding keeps it
(`target.new_cache()`:
fp32 where the `rowwise` kernel computes a half-precision model's rows in fp32, which otherwise
upcasts the whole cache in every layer of every step), at several context lengths.

For each precision and context it times the target's forward over 1 token (a plain step) and
over 8 (a 7-draft verify), cropping back after each call as the engine does. The caches run in
alternation, call after call, so load elsewhere on the machine hits them alike. Prints the
median ms of REPEATS calls per cell and the ratios dynamic / growing and growing / decoding's
(above 1: the second is faster); ratios are within this one run.

Usage: .venv/bin/python scripts/reproduce/kv_cache_cost.py [DTYPE,...] [CONTEXT,...]
  (defaults: fp32,gguf,bf16 and 300,1000,2000)
"""

from __future__ import annotations

import functools
import sys

import torch
from transformers import DynamicCache

from dcoco.decode.cost_curve import interleaved_ms, machine_fingerprint
from dcoco.models.target.cache import crop_cache, new_cache
from dcoco.models.target.loading import load_target

TARGET, TOKENS, REPEATS = "smollm2-135m-instruct", (1, 8), 15


def time_caches(target, ids, context: int, tokens: int) -> list[float]:
    """Median ms of a forward over `tokens` after `context` (and the crop back), with each cache
    in alternation: [DynamicCache, growing, decoding's]."""
    caches = [DynamicCache(config=target.config), new_cache(target.config), target.new_cache()]
    for cache in caches:
        target.forward(ids[:, :context], cache, last_logits_only=True)
    block = ids[:, context : context + tokens]

    def step(cache):
        target.forward(block, cache)
        crop_cache(cache, context)

    return interleaved_ms([functools.partial(step, cache) for cache in caches], REPEATS)


def main(dtypes: list[str], contexts: list[int]) -> None:
    machine = machine_fingerprint()
    print(f"{machine['cpu']}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| dtype | context | tokens | DynamicCache ms | growing ms | decoding's ms | "
          "dynamic / growing | growing / decoding's |")  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    generator = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        target = load_target(TARGET, dtype, matmul="auto")
        ids = torch.randint(0, target.info.vocab_size, (1, max(contexts) + max(TOKENS)),
                            generator=generator)  # fmt: skip
        for context in contexts:
            for tokens in TOKENS:
                dynamic, growing, ours = time_caches(target, ids, context, tokens)
                print(f"| {dtype} | {context} | {tokens} | {dynamic:.2f} | {growing:.2f} | "
                      f"{ours:.2f} | {dynamic / growing:.2f} | {growing / ours:.2f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        (arguments[0] if arguments else "fp32,gguf,bf16").split(","),
        [int(c) for c in (arguments[1] if len(arguments) > 1 else "300,1000,2000").split(",")],
    )
