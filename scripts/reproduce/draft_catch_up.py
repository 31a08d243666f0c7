"""What a drafter's pass costs after plain cycles: the taps it catches up on.

A cycle that drafts nothing (k = 0 under `--num-draft-tokens auto`) does not run the drafter, so the
next pass reads every tap it skipped (dcoco.decode.engine: `skipped_features`) into the drafter's
context before drafting. This times one `dflash` pass of 3 drafts after n = 1..192 new positions,
over a 300-token context (random tokens and taps: the cost does not read them), at the target
precision and draft dtype given, the drafter's cache cropped back before each call, twice in
turn: as decoding runs it (w4a8 products keep up to draft_pass.CATCH_UP_ROWS rows on the int8-row
kernel) and with every product past MAX_ROWS rows on the layer's dequantised copy (as before that
limit). Prints the median ms of each per n, within this one run.

Usage: .venv/bin/python scripts/reproduce/draft_catch_up.py [--dtype gguf-a8] [--draft-dtype w4a8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dcoco.decode.cost_curve import CONTEXT, machine_fingerprint
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.decode.proposers import DraftContext
from dcoco.models.drafter import draft_pass
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.loading import DEFAULT_TARGET, load_target

CHUNKED = draft_pass.CATCH_UP_ROWS
NEW_POSITIONS, SLOTS, REPEATS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192), 3, 9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="gguf-a8", help="the target's precision")
    parser.add_argument("--draft-dtype", default="auto", help="the drafter's precision")
    args = parser.parse_args()
    target = load_target(DEFAULT_TARGET, args.dtype, None, "auto", "auto", "target")
    proposer = build_proposer("dflash", target, MethodOptions(draft_dtype=args.draft_dtype))
    machine = machine_fingerprint()
    setting = f"target {args.dtype}, draft dtype {args.draft_dtype}"
    print(f"{machine['cpu']} ({machine['isa']}), {torch.get_num_threads()} threads; {setting}; "
          f"median ms, {SLOTS} drafts a pass")  # fmt: skip
    print("| new positions | ms | ms, dequantised past 16 rows |")
    print("|--:|--:|--:|")
    most = max(NEW_POSITIONS)
    generator = torch.Generator().manual_seed(0)
    width = target.info.hidden_size * len(proposer.feature_layers)
    tokens = torch.randint(0, target.info.vocab_size, (CONTEXT + most,), generator=generator)
    features = torch.randn(1, CONTEXT + most, width, generator=generator).to(target.dtype)
    with torch.inference_mode():
        proposer.start(tokens[:CONTEXT].tolist())
        proposer.propose(DraftContext(tokens[:CONTEXT], features[:, :CONTEXT], SLOTS))
        for new in NEW_POSITIONS:
            context = DraftContext(tokens[: CONTEXT + new], features[:, CONTEXT : CONTEXT + new],
                                   SLOTS)  # fmt: skip
            samples: dict[int, list[float]] = {CHUNKED: [], 0: []}
            for _ in range(REPEATS + 1):
                for limit, times in samples.items():
                    draft_pass.CATCH_UP_ROWS = limit
                    crop_cache(proposer.cache, CONTEXT)
                    start = time.perf_counter()
                    proposer.propose(context)
                    times.append((time.perf_counter() - start) * 1000)
            chunked, dense = (statistics.median(times[1:]) for times in samples.values())
            print(f"| {new} | {chunked:.2f} | {dense:.2f} |", flush=True)
        draft_pass.CATCH_UP_ROWS = CHUNKED


if __name__ == "__main__":
    main()
