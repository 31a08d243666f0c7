"""What the DCOCO corrector's `select` costs at the shapes a vLLM server gives it, per precision and
candidate count: the requests x draft slots of a served schedule, the logits over the shipped
draft vocabulary's columns (16,000 for SmolLM2), random hidden states and logits (the cost does
not depend on their values). The corrector runs at the target's precision in the plugin (bf16);
fp32 is the alternative timed here, with the drafter's top 16 (`greedy`) and top 4 (`greedy/4`).
The four variants of a shape run in alternation, call after call; prints the median ms of 20 calls
and how often the fp32 picks equal the bf16 ones. Ratios are within this one run. With PROFILE=1,
also torch.profiler's ten costliest operators of the bf16 16-candidate call at each shape
(self CPU time over 20 calls), to see where a call's milliseconds go. With COMPILED=1, one more
column: the bf16 16-candidate call as the plugin serves it compiled
(dcoco.models.heads.head_compile,
warmed up for 1-7 slots first; its "same" share against the eager bf16 picks in the last column).

Usage: .venv/bin/python scripts/reproduce/corrector_served_cost.py [CHECKPOINT] [B x S,...]
  (defaults: dcoco-joint-12k 1x4,1x7,2x4,4x3,8x2)
"""

from __future__ import annotations

import os
import sys

import torch

from dcoco.decode.cost_curve import interleaved_ms
from dcoco.models.drafter.draft_vocab import read_ranking
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.heads.head_io import load_head
from dcoco.models.target.loading import load_target
from dcoco.paths import checkpoints_dir

TARGET, COLUMNS, CALLS = "smollm2-135m-instruct", 16000, 20


def main(checkpoint: str, shapes: list[tuple[int, int]]) -> None:
    path = checkpoints_dir() / TARGET / checkpoint
    heads = {}
    for dtype in ("bf16", "fp32"):
        target = load_target(TARGET, dtype)
        heads[dtype] = load_head(path, target, load_drafter(path, target))
        heads[dtype].prepare_inference()
    columns = read_ranking(checkpoints_dir() / TARGET, target.config.vocab_size)[:COLUMNS]
    generator = torch.Generator().manual_seed(0)
    print(f"{checkpoint}: ms per select, {COLUMNS} columns, {torch.get_num_threads()} threads")
    compiled = None
    if os.environ.get("COMPILED") == "1":
        from dcoco.models.heads.head_compile import HeadSelect

        compiled = HeadSelect(heads["bf16"], None, columns, max_slots=7)
    extra = (" bf16, 16, compiled | same, compiled |", "--:|--:|") if compiled else ("", "")
    print(f"| requests x slots | bf16, 16 | fp32, 16 | bf16, 4 | fp32, 4 | same picks |{extra[0]}")
    print(f"|---|--:|--:|--:|--:|--:|{extra[1]}")
    for batch, slots in shapes:
        width = heads["bf16"].config.hidden_size
        hidden = torch.randn(batch, slots, width, generator=generator).bfloat16()
        logits = (4 * torch.randn(batch, slots, COLUMNS, generator=generator)).bfloat16()
        anchors = columns[torch.randint(0, COLUMNS, (batch,), generator=generator)]
        calls = [
            _select(heads[dtype], (hidden, logits, anchors), rule, columns)
            for rule in ("greedy", "greedy/4")
            for dtype in ("bf16", "fp32")
        ]
        same = [(calls[i]() == calls[i + 1]()).float().mean().item() for i in (0, 2)]
        if compiled is not None:
            with torch.inference_mode():  # inference tensors, as vLLM's and our engine's are:
                block = tuple(t.clone() for t in (hidden, logits, anchors))  # as the warm-up's
                same.append((compiled(*block) == calls[0]()).float().mean().item())
            calls.append(lambda block=block: _inference(compiled, block))
        ms = interleaved_ms(calls, CALLS, 3)
        cells = " | ".join(f"{m:.2f}" for m in ms)
        tail = f" {same[2]:.0%} |" if compiled is not None else ""
        print(f"| {batch} x {slots} | {cells} | {min(same[:2]):.0%} |{tail}", flush=True)
        if os.environ.get("PROFILE") == "1":
            _profile(calls[0], f"{batch} x {slots}")


def _select(head, block, rule: str, columns):
    def call():
        with torch.no_grad():
            return head.select(*block, selection=rule, column_ids=columns)

    return call


def _inference(select, block):
    with torch.inference_mode():
        return select(*block)


def _profile(call, shape: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(CALLS):
            call()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    print(f"bf16, 16 candidates, {shape}, {CALLS} calls:\n{table}", flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        arguments[0] if arguments else "dcoco-joint-12k",
        [
            tuple(int(n) for n in shape.split("x"))
            for shape in (arguments[1] if len(arguments) > 1 else "1x4,1x7,2x4,4x3,8x2").split(",")
        ],
    )
