"""Drafter training throughput with records side by side in one forward (`--records-per-forward`).

Times the training step's drafter work (forwards, losses and backward of one batch; the target's
taps computed once beforehand, as the feature cache serves them) for each records-per-forward
setting in turn, on the same batch and weights, and prints the median tokens/s of each with the
loss it computed (equal at fp32: the setting changes how a step is batched, not what it learns).

Usage: .venv/bin/python scripts/reproduce/records_per_forward.py [--batch-size 8]
       [--per-forward 1,2,4,8] [--repeats 5] [--data-dir ../shared]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from dcoco.decode.cost_curve import machine_fingerprint
from dcoco.paths import checkpoints_dir, default_corpus
from dcoco.train import loop
from dcoco.train.block_pass import prepare_item
from dcoco.train.drafter_train import DrafterTrainConfig
from dcoco.train.step import step_losses
from dcoco.train.target_features import TargetFeatures

TARGET = "smollm2-135m-instruct"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8, help="records per step")
    parser.add_argument("--per-forward", default="1,2,4,8", help="records-per-forward settings")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per setting")
    parser.add_argument("--anchor-chunk", type=int, default=32, help="as --anchor-chunk")
    args = parser.parse_args()
    settings = [int(v) for v in args.per_forward.split(",")]
    with tempfile.TemporaryDirectory() as out:
        config = DrafterTrainConfig(
            out=out, target=TARGET, corpus=str(default_corpus(TARGET)), max_records=64,
            init=str(checkpoints_dir() / TARGET / "dflash"), batch_size=args.batch_size,
            anchor_stride=4, feature_cache="off", anchor_chunk=args.anchor_chunk,
        )  # fmt: skip
        run = loop.setup(config, None, None, None)
        features = TargetFeatures(run.target, run.drafter.config.target_layer_ids, "")
        batch = run.train_set[: args.batch_size]
        items = [
            prepare_item(s, features, run.anchor_rule, run.block_size, torch.Generator(), 0, "cpu")
            for s in batch
        ]
        tokens = sum(s.num_tokens for s in batch)
        times: dict[int, list[float]] = {p: [] for p in settings}
        losses: dict[int, float] = {}
        run.drafter.train()
        for _ in range(args.repeats + 1):  # the first round warms up, untimed
            for per_forward in settings:
                run.config.records_per_forward = per_forward
                tick = time.perf_counter()
                losses[per_forward] = step_losses(run, items, run.loss_vocab, backward=True)["loss"]
                times[per_forward].append(time.perf_counter() - tick)
                run.optimizer.zero_grad(set_to_none=True)
    print(f"machine: {machine_fingerprint()}; threads {torch.get_num_threads()}")
    print(f"batch: {len(batch)} records, {tokens} tokens; fp32; anchor chunk {args.anchor_chunk}")
    base = statistics.median(times[settings[0]][1:])
    print("| records per forward | step s | tokens/s | vs first | loss |")
    print("|--:|--:|--:|--:|--:|")
    for per_forward in settings:
        step_s = statistics.median(times[per_forward][1:])
        print(
            f"| {per_forward} | {step_s:.3f} | {tokens / step_s:.0f} | {base / step_s:.2f}x "
            f"| {losses[per_forward]:.6f} |"
        )


if __name__ == "__main__":
    main()
