"""What the rowwise attention's one-query rows cost at half precision: SDPA's kernel against the
fp32 product (dcoco.models.target.rowwise_attention) that rows take on a CPU without native bf16.

For each precision and context it times the target's forward over 1 token (a plain step) and over
8 (a 7-draft verify: 8 one-query rows), with the rows on SDPA and on the fp32 product in
alternation, call after call, so load elsewhere on the machine hits both alike. On a CPU with
native bf16 the engine keeps SDPA; this script times both there too. Prints median ms of REPEATS
calls per cell and the ratio SDPA / fp32 product (above 1: the product is faster); ratios are
within this one run.

Usage: .venv/bin/python scripts/reproduce/attention_rows.py [DTYPE,...] [CONTEXT,...]
  (defaults: gguf,bf16 and 300,1000)
"""

from __future__ import annotations

import functools
import sys

import torch

import dcoco.models.target.rowwise_attention as rowwise_attention
from dcoco.decode.cost_curve import interleaved_ms, machine_fingerprint
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.loading import load_target

TARGET, TOKENS, REPEATS = "smollm2-135m-instruct", (1, 8), 11


def time_paths(target, ids, context: int, tokens: int) -> list[float]:
    """Median ms of a forward over `tokens` after `context` (and the crop back), the rows on SDPA
    and as the fp32 product in alternation: [SDPA, product]."""
    cache = target.new_cache()
    target.forward(ids[:, :context], cache, last_logits_only=True)
    block = ids[:, context : context + tokens]

    def forward(native: bool):  # a CPU with native bf16 keeps SDPA
        rowwise_attention.native_bf16 = lambda: native
        target.forward(block, cache)
        crop_cache(cache, context)

    return interleaved_ms([functools.partial(forward, native) for native in (True, False)], REPEATS)


def main(dtypes: list[str], contexts: list[int]) -> None:
    machine = machine_fingerprint()
    print(f"{machine['cpu']} ({machine['isa']}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")  # fmt: skip
    print("| dtype | context | tokens | rows on SDPA, ms | rows as fp32 product, ms | ratio |")
    print("|---|--:|--:|--:|--:|--:|")
    generator = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        target = load_target(TARGET, dtype)
        ids = torch.randint(0, target.info.vocab_size, (1, max(contexts) + max(TOKENS)),
                            generator=generator)  # fmt: skip
        for context in contexts:
            for tokens in TOKENS:
                sdpa, product = time_paths(target, ids, context, tokens)
                print(f"| {dtype} | {context} | {tokens} | {sdpa:.1f} | {product:.1f} | "
                      f"{sdpa / product:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        (arguments[0] if arguments else "gguf,bf16").split(","),
        [int(c) for c in (arguments[1] if len(arguments) > 1 else "300,1000").split(",")],
    )
