"""What a drafter layer's halves as one C++ call each (dcoco.models.target.int4_dot.qkv and .mlp,
w4a8 drafters: q|k|v with the norm before it and the per-head norms and rotary after it; the MLP
with its norm and residual) and the copy gate's bonus in one (cpu_kernels.copy_bonus) take off a
draft, against the same pass with them on PyTorch's operators.

One process, one loaded target (gguf-a8 unless given), two proposers per method (`dflash`,
`dcoco`) as decoding builds them (`--draft-dtype auto`: w4a8 where its kernel builds): one as it
is, one with each layer's `fused` off and the bonus added by the operators. The drafter's pass
of 1-7 slots (`draft_block`, without `dcoco`'s correction) after 2 new taps over a 300-token
cache, random tokens and taps, the two in alternation call after call, so load elsewhere on the
machine hits both alike. Prints median ms and the ratio operators / fused
(above 1: the fused calls are faster), within this one run.

Usage: .venv/bin/python scripts/reproduce/draft_fusion_cost.py [DTYPE]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

from dcoco.decode.cost_curve import interleaved_ms, machine_fingerprint
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.models.drafter import copy_hints, drafter
from dcoco.models.target.loading import DEFAULT_TARGET, load_target

SLOTS, REPEATS = (1, 2, 3, 4, 5, 7), 30
sys.path.insert(0, str(Path(__file__).parent))
from draft_pass_cost import cycle  # noqa: E402 - the draft call `draft_pass_cost.py` times


def with_operators(call):
    """`call` with the copy bonus on PyTorch's operators for its duration."""

    def run():
        drafter.add_copy_bonus = functools.partial(copy_hints.add_copy_bonus, fused=False)
        try:
            call()
        finally:
            drafter.add_copy_bonus = copy_hints.add_copy_bonus

    return run


def main(dtype: str) -> None:
    machine = machine_fingerprint()
    print(f"{machine['cpu']} ({machine['isa']}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; {dtype} target, median ms a draft")  # fmt: skip
    target = load_target(DEFAULT_TARGET, dtype, None, "auto", "auto", "target")
    print("| draft | fused | operators | operators / fused |")
    print("|---|--:|--:|--:|")
    for method in ("dflash", "dcoco"):
        fused, operators = (build_proposer(method, target, MethodOptions()) for _ in range(2))
        layers = operators.drafter._fast[0].layers if operators.drafter._fast else []
        if not any(layer.fused for layer in layers):
            raise SystemExit("the drafter's products are not w4a8 here: nothing to compare")
        for layer in layers:
            layer.fused = False
        for slots in SLOTS:
            calls = [
                cycle(fused, slots, pass_only=True),
                with_operators(cycle(operators, slots, pass_only=True)),
            ]
            with torch.inference_mode():
                ms_fused, ms_operators = interleaved_ms(calls, REPEATS, 5)
            print(f"| {method}, k = {slots} | {ms_fused:.2f} | {ms_operators:.2f} | "
                  f"{ms_operators / ms_fused:.2f}x |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gguf-a8")
