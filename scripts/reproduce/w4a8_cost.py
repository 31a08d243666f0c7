"""What int8 activations (dcoco.models.target.int4_dot: w4a8) take off the target's steps and
verifies (dtype gguf-a8 against gguf) and off a draft (`--draft-dtype w4a8` against `int4`).

One process: the target loaded at gguf and at gguf-a8 (the same GGUF codes; bf16 activations
against rows rounded to int8 per 32 inputs), their forward over 1 token (a step) and over 2-8 (a
verify of 1-7 drafts) after a 300-token context; then one `dflash` proposer per drafter setting on
the gguf target, a draft of 1-7 slots as `dcoco profile` times it (2 new taps, random tokens and
taps). The two settings of each call run in alternation, so load elsewhere on the machine hits
both alike. Prints median ms and the ratio int4 / w4a8 (above 1: w4a8 is faster), within this one
run. `--draft-baseline fp32` sets the draft against fp32 instead of int4 (what `auto` drafts in
where bf16 is emulated: AVX2 only).

Usage: .venv/bin/python scripts/reproduce/w4a8_cost.py [--draft-baseline int4|fp32|target]
On an AVX-512 machine, the AVX2 paths (AMD Zen 3's): DCOCO_CPU_ARCH=haswell ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python scripts/reproduce/w4a8_cost.py --draft-baseline fp32
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from dcoco.decode.cost_curve import interleaved_ms, machine_fingerprint
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.models.target.int4_dot import int4_dot_available, int4_dot_isa
from dcoco.models.target.loading import DEFAULT_TARGET, load_target

TOKENS, SLOTS, REPEATS = (1, 2, 3, 5, 8), (1, 2, 3, 4, 5, 7), 30
sys.path.insert(0, str(Path(__file__).parent))
from cpu_kernels_cost import forward_call  # noqa: E402 - a step or verify after 300 tokens
from draft_pass_cost import cycle  # noqa: E402 - the draft call `draft_pass_cost.py` times


def compare(name: str, int4_call, w4a8_call) -> None:
    int4, w4a8 = interleaved_ms([int4_call, w4a8_call], REPEATS, 5)
    print(f"| {name} | {int4:.2f} | {w4a8:.2f} | {int4 / w4a8:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft-baseline", default="int4", choices=("int4", "fp32", "target"),
                        help="the drafter setting the w4a8 draft is set against")  # fmt: skip
    baseline = parser.parse_args().draft_baseline
    if not int4_dot_available():
        raise SystemExit("the w4a8 kernel does not build here (AVX-512 VNNI or AVX2): no timing")
    machine = machine_fingerprint()
    print(f"{machine['cpu']} ({machine['isa']}, kernels {int4_dot_isa()}, torch "
          f"{torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; median ms, int4 (bf16 rows), w4a8 (int8 rows); "
          f"drafts: {baseline} against w4a8")  # fmt: skip
    print("| call | int4 or baseline | w4a8 | ratio |")
    print("|---|--:|--:|--:|")
    gguf = load_target(DEFAULT_TARGET, "gguf", None, "auto", "auto", "target")
    gguf_a8 = load_target(DEFAULT_TARGET, "gguf-a8", None, "auto", "auto", "target")
    with torch.inference_mode():
        for tokens in TOKENS:
            name = f"target forward, {tokens} token{'s' if tokens > 1 else ''} (gguf / gguf-a8)"
            compare(name, forward_call(gguf, tokens), forward_call(gguf_a8, tokens))
        del gguf_a8
        proposers = [build_proposer("dflash", gguf, MethodOptions(draft_dtype=setting))
                     for setting in (baseline, "w4a8")]  # fmt: skip
        for slots in SLOTS:
            compare(f"dflash draft, k = {slots}", *(cycle(p, slots) for p in proposers))


if __name__ == "__main__":
    main()
