"""What the fused CPU kernels (dcoco.models.cpu.cpu_kernels: one C++ call for an RMSNorm, one for a
rotary with its per-head norms) take off a decoding step, a verify and a draft, against the same
code on PyTorch's operators.

One process, one loaded target (gguf unless given; bf16 activations), one `dflash` proposer as
decoding builds it (`--draft-dtype auto`, `--draft-block drafted`): each call runs once with the
kernels and once without, in alternation, so load elsewhere on the machine hits both alike. The
target's forward over 1 token (a step) and over 5 (a 4-draft verify) after a 300-token context,
and a draft of 1-4 and 7 slots as `dcoco profile` times it (2 new taps, random tokens and taps);
then the drafter's attention alone (dcoco.models.cpu.cpu_kernels.draft_attention against SDPA: 9
query heads of 64 over 3 kv heads, the 2-8 query positions of a 1-7 slot draft, over 307 keys).
Prints median ms and the ratio operators / fused (above 1: the kernels are faster); ratios are
within this one run.

Usage: .venv/bin/python scripts/reproduce/cpu_kernels_cost.py [DTYPE]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from dcoco.decode.cost_curve import CONTEXT, interleaved_ms, machine_fingerprint
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.models.cpu import cpu_kernels
from dcoco.models.drafter.draft_pass import DraftPass
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.loading import DEFAULT_TARGET, load_target

SLOTS, REPEATS = (1, 2, 3, 4, 7), 40
sys.path.insert(0, str(Path(__file__).parent))
from draft_pass_cost import cycle  # noqa: E402 - the draft call `draft_pass_cost.py` times


def with_kernels(call, fused: bool):
    """`call` with the kernels on or off for its duration."""
    served = cpu_kernels.takes

    def run():
        cpu_kernels.takes = served if fused else (lambda x: False)
        try:
            call()
        finally:
            cpu_kernels.takes = served

    return run


def forward_call(target, tokens: int):
    ids = torch.randint(0, target.info.vocab_size, (1, CONTEXT + tokens),
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    cache = target.new_cache()
    target.forward(ids[:, :CONTEXT], cache, last_logits_only=True)

    def call():
        target.forward(ids[:, CONTEXT:], cache)
        crop_cache(cache, CONTEXT)

    return call


def attention_row(queries: int) -> None:
    """The drafter's attention for `queries` query positions (9 heads over 3 kv heads) over 307
    cached keys: the kernel, reading the heads in place, vs SDPA with the pass's regrouping."""
    qk = torch.randn(queries, 12, 64).to(torch.bfloat16)
    key, value = torch.randn(2, 1, 3, 2 * CONTEXT, 64).to(torch.bfloat16)[:, :, :, :307]
    query = qk[:, :9]  # [queries, q heads, 64], a view of q|k as the pass hands it over
    if not cpu_kernels.attends(query, key):
        return  # no AVX-512 bf16: the draft pass keeps SDPA
    fused, sdpa = interleaved_ms([lambda: cpu_kernels.draft_attention(query, key, value),
                                  lambda: DraftPass._sdpa(query, key, value, 3)],
                                 REPEATS * 10, 20)  # fmt: skip
    print(f"| draft attention, {queries} x 3 grouped query rows (SDPA) | {fused:.3f} | "
          f"{sdpa:.3f} | {sdpa / fused:.2f}x |", flush=True)  # fmt: skip


def main(dtype: str) -> None:
    machine = machine_fingerprint()
    if cpu_kernels.kernels() is None:
        raise SystemExit("the fused CPU kernels do not build here: nothing to compare")
    print(f"{machine['cpu']} ({machine['isa']}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; {dtype}, median ms, fused kernels vs operators")  # fmt: skip
    print("| call | fused | operators | operators / fused |")
    print("|---|--:|--:|--:|")
    target = load_target(DEFAULT_TARGET, dtype, None, "auto", "auto", "target")
    proposer = build_proposer("dflash", target, MethodOptions())
    # made one at a time: each draft's set-up restarts the proposer
    calls = {"step (1 token)": lambda: forward_call(target, 1),
             "verify (5 tokens)": lambda: forward_call(target, 5)}  # fmt: skip
    calls |= {f"dflash draft, k = {k}": lambda k=k: cycle(proposer, k) for k in SLOTS}
    with torch.inference_mode():
        for name, make in calls.items():
            call = make()
            fused, operators = interleaved_ms(
                [with_kernels(call, True), with_kernels(call, False)], REPEATS, 5
            )
            print(f"| {name} | {fused:.2f} | {operators:.2f} | {operators / fused:.2f}x |",
                  flush=True)  # fmt: skip
    for queries in (2, 5, 8):
        attention_row(queries)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gguf")
